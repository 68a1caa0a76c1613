"""Prefill/decode disaggregation over real HTTP with SmolLM2 (float32, so greedy output can be
compared token for token): a decode node hands its prompts to a prefill node, through the
answer's body or through Redis, and prefills itself when the prefill node fails; the gateway
routes to the decode pool and names a prefill node."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from edgefire.contract.cities import load_city
from edgefire.contract.headers import NODE_SECRET, PREFILL_NODE
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.runtime.server.metrics import ServerMetrics
from edgefire.runtime.server.prefill import PREFILL_PATH, PrefillHandoff, frame, unframe
from edgefire.testing.fleet import free_port
from tests.redis_support import needs_redis

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
RUN = f"/client/v4/accounts/acct/ai/run/{SMOL}"
SECRET = "pd-test-secret"
# ~300 tokens: eighteen full blocks of 16 to hand over.
STORY = " ".join(f"Item {i} of the inventory is a {c} box." for i, c in
                 enumerate(["red", "green", "blue", "small", "large"] * 6))
MESSAGES = [{"role": "system", "content": STORY},
            {"role": "user", "content": "Which colour is item 7? Answer in one sentence."}]


def _node(role: str, **settings) -> EdgeNode:
    return EdgeNode(load_city("fra"), NodeSettings(role=role, dtype="float32", kv_cache_mib=64,
                                                   node_secret=SECRET, prefill_timeout_s=20,
                                                   **settings))


@contextlib.contextmanager
def _serving(serve, *nodes: EdgeNode) -> Iterator[list[httpx.Client]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(httpx.Client(
            base_url=stack.enter_context(serve(create_app(n))), timeout=120,
            headers={NODE_SECRET: SECRET})) for n in nodes]


def _ask(client: httpx.Client, prefill: str | None = None, **inputs) -> dict:
    headers = {PREFILL_NODE: prefill} if prefill else {}
    response = client.post(RUN, json={"messages": MESSAGES, "max_tokens": 24, "temperature": 0,
                                      **inputs}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def _handoffs(client: httpx.Client, outcome: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("edgefire_prefill_handoffs_total{") and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(serve):
    """A `both` node (the reference), a prefill node and a decode node, all local_paged."""
    with _serving(serve, _node("both"), _node("prefill"), _node("decode")) as clients:
        yield clients


def test_the_decode_node_takes_the_prompt_from_the_prefill_node_with_identical_output(fleet):
    both, prefill, decode = fleet
    reference = _ask(both)
    handed = _ask(decode, str(prefill.base_url))
    assert handed["response"] == reference["response"]
    cached = handed["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt_tokens = handed["usage"]["prompt_tokens"]
    assert cached == (prompt_tokens - 1) // 16 * 16 > 256  # every full block came over
    assert _handoffs(decode, "http") == 1
    # The prefill node's pages are the only prefill the decode node skipped: its own count of
    # prefilled tokens is the prompt's last partial block.
    assert decode.get("/health").json()["role"] == "decode"


def test_a_cached_prompt_is_not_handed_off_again(fleet):
    _, prefill, decode = fleet
    _ask(decode, str(prefill.base_url))
    before = _handoffs(decode, "http")
    _ask(decode, str(prefill.base_url))
    assert _handoffs(decode, "http") == before


def test_a_prefill_node_that_fails_leaves_the_decode_node_to_prefill(fleet, serve):
    both, _, decode = fleet

    async def dies_mid_answer(request: Request) -> StreamingResponse:
        async def body():
            yield frame([b"x" * 100])[:50]
            raise ConnectionResetError("the prefill node died")  # uvicorn drops the connection

        return StreamingResponse(body(), media_type="application/octet-stream")

    dying = Starlette(routes=[Route(PREFILL_PATH, dies_mid_answer, methods=["POST"])])
    before = _handoffs(decode, "fallback")
    with serve(dying) as dying_url:
        # Dies mid-answer; refuses connections. A new prompt each, so neither is cached.
        for i, url in enumerate((dying_url, "http://127.0.0.1:9")):
            messages = [{"role": "user", "content": f"Run {i}. {STORY}"}]
            reference = _ask(both, max_tokens=8, messages=messages)
            got = _ask(decode, url, max_tokens=8, messages=messages)
            assert got["response"] == reference["response"]
    assert _handoffs(decode, "fallback") == before + 2


def test_a_prefill_node_killed_mid_handoff_leaves_the_decode_node_to_prefill(fleet):
    both, _, decode = fleet
    port = free_port()
    env = {**os.environ, "EDGEFIRE_NODE_SECRET": SECRET, "EDGEFIRE_ROLE": "prefill",
           "EDGEFIRE_DTYPE": "float32", "EDGEFIRE_KV_CACHE_MIB": "64"}
    process = subprocess.Popen([sys.executable, "-m", "edgefire.edge_nodes.cli", "start",
                                "--city", "fra", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120, headers={NODE_SECRET: SECRET}) as prefill:
            deadline = time.monotonic() + 120
            while True:  # up, then the model loaded by a first hand-off
                with contextlib.suppress(httpx.HTTPError):
                    if prefill.post(PREFILL_PATH, json={
                            "model": SMOL, "prompt_token_ids": [1] * 40, "salt": "00",
                            "via": "http"}).status_code == 200:
                        break
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            messages = [{"role": "user", "content": f"Killed. {STORY} {STORY} {STORY}"}]
            reference = _ask(both, max_tokens=8, messages=messages)
            before = _handoffs(decode, "fallback")
            answer: dict = {}
            asking = threading.Thread(target=lambda: answer.update(
                _ask(decode, url, max_tokens=8, messages=messages)))
            asking.start()
            while "edgefire_requests_running{" not in (text := prefill.get("/metrics").text) \
                    or f'edgefire_requests_running{{model_name="{SMOL}"}} 1.0' not in text:
                assert asking.is_alive(), "the prefill node finished before it was killed"
                time.sleep(0.02)
            process.kill()  # mid-prefill, the decode node waiting on its answer
            asking.join(120)
    finally:
        process.kill()
        process.wait()
    assert answer["response"] == reference["response"]
    assert _handoffs(decode, "fallback") == before + 1


def test_only_a_decode_node_honours_the_header_and_an_open_one_only_on_loopback(fleet):
    both, prefill, _ = fleet
    before = _handoffs(both, "http") + _handoffs(both, "fallback")
    _ask(both, str(prefill.base_url))
    assert _handoffs(both, "http") + _handoffs(both, "fallback") == before
    open_node = EdgeNode(load_city("fra"), NodeSettings(role="decode"))
    handoff = PrefillHandoff(open_node, ServerMetrics(open_node).prefill_handoffs)
    assert handoff.accepts("http://127.0.0.1:8801")
    assert not handoff.accepts("http://10.1.2.3:8801")
    assert not handoff.accepts("file:///etc/passwd")


def test_the_prefill_route_wants_the_node_secret_and_a_well_formed_body(fleet):
    _, prefill, _ = fleet
    url = PREFILL_PATH
    assert prefill.post(url, json={}, headers={NODE_SECRET: "wrong"}).status_code == 401
    bad = prefill.post(url, json={"model": SMOL, "prompt_token_ids": [1, 2], "salt": "zz",
                                  "via": "http"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["code"] == 5006
    assert prefill.post(url, json={"model": SMOL, "prompt_token_ids": "no", "salt": "",
                                   "via": "http"}).status_code == 400
    assert unframe(frame([b"a", b"bc"])) == [b"a", b"bc"]
    assert unframe(frame([b"a", b"bc"])[:-1]) == [b"a", None]


@needs_redis
def test_with_redis_the_pages_go_through_the_store(serve, redis_prefix, monkeypatch):
    monkeypatch.setenv("EDGEFIRE_KV_STORE_PREFIX", redis_prefix.rstrip(":"))
    reference_node = _node("both")
    nodes = [_node("prefill", kv_backend="redis"), _node("decode", kv_backend="redis")]
    with _serving(serve, reference_node, *nodes) as (both, prefill, decode):
        messages = [{"role": "user", "content": STORY + " Which item is blue?"}]
        reference = _ask(both, messages=messages)
        handed = _ask(decode, str(prefill.base_url), messages=messages)
        assert handed["response"] == reference["response"]
        assert handed["usage"]["prompt_tokens_details"]["cached_tokens"] > 256
        assert _handoffs(decode, "store") == 1
        metrics = decode.get("/metrics").text
        assert 'edgefire_prefix_cache_remote_hits_total{model_name="' in metrics
        assert decode.get("/health").json()["kv_store"][SMOL] == {"backend": "redis",
                                                                  "state": "ok"}
