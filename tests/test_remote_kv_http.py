"""The `redis` KV backend between real nodes over HTTP, with SmolLM2 in float32: a second node
serves a prompt whose prefix the first computed, and a Redis that stops mid-run costs only the
reuse (a private redis-server, so the shared one is never stopped)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from edgefire.contract.cities import load_city
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server import create_app
from edgefire.testing.fleet import free_port
from tests.redis_support import needs_redis

pytestmark = [pytest.mark.slow, needs_redis]

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
RUN = f"/client/v4/accounts/acct/ai/run/{SMOL}"
SECRET = "kv-test-secret"  # nodes that share a store share the secret that keys the salts
PREFIX = ("You are the archivist of a small museum. " * 3 +
          " ".join(f"Room {i} holds exhibit {i * 7}." for i in range(40)))


def _node(city: str) -> EdgeNode:
    return EdgeNode(load_city(city), NodeSettings(kv_backend="redis", dtype="float32",
                                                  kv_cache_mib=64, node_secret=SECRET))


def _ask(client: httpx.Client, question: str, account: str = "acct") -> dict:
    response = client.post(RUN.replace("acct", account), json={
        "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": question}],
        "max_tokens": 16, "temperature": 0}, headers={"x-edgefire-node-secret": SECRET})
    assert response.status_code == 200, response.text
    return response.json()["result"]


def _flush(node: EdgeNode) -> None:
    tier = node.registry.models()[SMOL].engine.remote_tier
    assert tier is not None and tier.flush(30)


@contextlib.contextmanager
def _clients(serve, *nodes: EdgeNode) -> Iterator[list[httpx.Client]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(httpx.Client(base_url=stack.enter_context(serve(create_app(n))),
                                                timeout=120)) for n in nodes]


def test_a_second_node_reuses_the_prefix_the_first_computed(serve, redis_prefix, monkeypatch):
    monkeypatch.setenv("EDGEFIRE_KV_STORE_PREFIX", redis_prefix.rstrip(":"))
    fra, lhr = _node("fra"), _node("lhr")
    with _clients(serve, fra, lhr) as (a, b):
        first = _ask(a, "Which exhibit is in room 12?")
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        _flush(fra)
        second = _ask(b, "Which exhibit is in room 12?")
        assert second["response"] == first["response"]  # as if node B had computed it
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == (second["usage"]["prompt_tokens"] - 1) // 16 * 16
        # Another question on the same long prefix: node B's own pool now has it.
        third = _ask(b, "Which exhibit is in room 3?")
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] >= 400
        # Another account never reads those pages.
        assert _ask(b, "Which exhibit is in room 12?", account="other")[
            "usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        metrics = b.get("/metrics").text
        hits = [line for line in metrics.splitlines()
                if line.startswith("edgefire_prefix_cache_remote_hits_total{")]
        assert float(hits[0].rsplit(" ", 1)[1]) == cached
        assert "edgefire_kv_store_latency_seconds_bucket" in metrics


@contextlib.contextmanager
def _private_redis(port: int) -> Iterator[subprocess.Popen]:
    server = shutil.which("redis-server")
    assert server, "redis-server is installed wherever Redis runs (the CI machine has it)"
    process = subprocess.Popen([server, "--port", str(port), "--save", "", "--appendonly", "no",
                                "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=port, socket_connect_timeout=0.2) as client:
                    client.ping()
                break
            except redis.RedisError:
                assert time.monotonic() < deadline, "the private redis-server did not start"
                time.sleep(0.05)
        yield process
    finally:
        process.kill()
        process.wait()


def test_redis_stopped_mid_run_degrades_to_the_local_pool(serve, monkeypatch):
    port = free_port()
    monkeypatch.setenv("EDGEFIRE_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    node = _node("fra")
    with _private_redis(port) as server, _clients(serve, node) as (client,):
        _ask(client, "Which exhibit is in room 1?")
        _flush(node)
        assert client.get("/health").json()["kv_store"][SMOL]["state"] == "ok"
        server.kill()
        server.wait()
        for i in range(3):  # served from the local pool, no error, however often
            answer = _ask(client, f"Which exhibit is in room {i + 20}?")
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 400
        _flush(node)
        health = client.get("/health").json()
        assert health["status"] == "ok"
        assert health["kv_store"][SMOL] == {"backend": "redis", "state": "unreachable"}
        assert "edgefire_kv_store_up{" in client.get("/metrics").text
        up = [line for line in client.get("/metrics").text.splitlines()
              if line.startswith("edgefire_kv_store_up{")]
        assert up[0].endswith(" 0.0")
