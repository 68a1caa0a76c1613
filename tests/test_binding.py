"""The env.AI binding (edgefire.AI) against a real gateway over HTTP and a stand-in edge node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.gateway import MODEL, USAGE, fake_node_app, heartbeat
from edgefire import AI, AiGatewayLogNotFound, InferenceUpstreamError
from edgefire.binding import gateway_headers
from edgefire.gateway.accounts import AccountStore
from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState

RESULT = {"response": "hi", "usage": USAGE}
# In the catalog, so the gateway routes it, but the stand-in node does not serve it.
UNSERVED = "@cf/huggingfacetb/smollm2-135m-instruct-int8"


@dataclass(slots=True)
class Fleet:
    base_url: str
    account_id: str
    token: str
    seen: list[dict]  # what the node was sent: {"model", "body"}

    def call(self, use: Callable[[AI], Awaitable[Any]], token: str | None = None) -> Any:
        async def go() -> Any:
            async with AI(self.base_url, self.account_id, token or self.token) as ai:
                return await use(ai)

        return asyncio.run(go())


@pytest.fixture(scope="module")
def fleet(serve) -> Iterator[Fleet]:
    settings = GatewaySettings(heartbeat_timeout_s=3600, node_secret=None, redis_url=None,
                               gateway_config=None)
    state = GatewayState.build(settings, db=Database(":memory:"))
    accounts = AccountStore(state.db)
    account_id = accounts.create_account("binding").id
    _, token = accounts.create_token(account_id)
    seen: list[dict] = []
    with serve(fake_node_app(seen)) as node, serve(create_app(state)) as base_url:
        httpx.post(f"{base_url}/internal/nodes/heartbeat", json=heartbeat(node)).raise_for_status()
        yield Fleet(base_url, account_id, token, seen)


def test_run_returns_the_result_object(fleet: Fleet, tmp_path: Path) -> None:
    dev_file = tmp_path / "dev.json"
    dev_file.write_text(json.dumps({"account_id": fleet.account_id, "token": fleet.token}))

    async def use() -> tuple[Any, AI]:
        async with AI.from_dev_file(dev_file, fleet.base_url) as ai:
            return await ai.run(MODEL, {"prompt": "Hello"}), ai

    result, ai = asyncio.run(use())
    assert result == RESULT
    assert ai.lastRequestHttpStatusCode == 200 and ai.aiGatewayLogId is None
    assert fleet.seen[-1] == {"model": MODEL, "body": {"prompt": "Hello"}}


@pytest.mark.parametrize("options", [None, {"gateway": {"id": "default"}}])
def test_streaming_yields_events_then_ends(fleet: Fleet, options: dict | None) -> None:
    async def use(ai: AI) -> list[dict]:
        return [event async for event in await ai.run(MODEL, {"prompt": "Hi", "stream": True},
                                                      options)]

    assert fleet.call(use) == [{"response": "h"}, {"response": "i"},
                               {"response": "", "usage": USAGE}]


def test_gateway_caches_and_logs(fleet: Fleet) -> None:
    options = {"gateway": {"id": "default", "cacheTtl": 60, "metadata": {"user": "ada", "n": 1}}}
    inputs = {"prompt": "cache me"}

    async def use(ai: AI) -> None:
        sent = len(fleet.seen)
        assert await ai.run(MODEL, inputs, options) == RESULT
        raw = await ai.run(MODEL, inputs, {**options, "returnRawResponse": True})
        assert raw.headers["cf-aig-cache-status"] == "HIT" and raw.json()["result"] == RESULT
        assert len(fleet.seen) == sent + 1  # the hit never reached the node
        assert ai.aiGatewayLogId == raw.headers["cf-aig-log-id"]
        log = await ai.gateway("default").get_log(ai.aiGatewayLogId)
        assert (log["id"], log["model"], log["cached"]) == (ai.aiGatewayLogId, MODEL, True)
        assert log["metadata"] == {"user": "ada", "n": 1}
        skip = {"gateway": {**options["gateway"], "skipCache": True}, "returnRawResponse": True}
        assert (await ai.run(MODEL, inputs, skip)).headers["cf-aig-cache-status"] == "MISS"
        assert len(fleet.seen) == sent + 2

    fleet.call(use)


def test_options_on_the_wire(fleet: Fleet) -> None:
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    gateway = {"id": "default", "skipCache": True, "cacheTtl": 120, "cacheKey": "k1",
               "metadata": {"a": 1}, "collectLog": False, "requestTimeoutMs": 5000,
               "retries": {"maxAttempts": 2, "retryDelayMs": 10, "backoff": "linear"}}
    options = {"gateway": gateway, "extraHeaders": {"x-session-affinity": "s-1"},
               "rejectIfBusy": True}

    async def use() -> tuple[AI, bool]:
        async with httpx.AsyncClient(event_hooks={"request": [record]}) as http:
            async with AI(fleet.base_url, fleet.account_id, fleet.token, http=http) as ai:
                assert await ai.run(MODEL, {"prompt": "wire"}, options) == RESULT
            return ai, http.is_closed

    ai, closed = asyncio.run(use())
    assert not closed  # the binding closes only a client it made
    request = sent[-1]
    assert request.url.path == f"/v1/{fleet.account_id}/default/workers-ai/{MODEL}"
    assert {k: request.headers[k] for k in gateway_headers(gateway)} == {
        "cf-aig-skip-cache": "true", "cf-aig-cache-ttl": "120", "cf-aig-cache-key": "k1",
        "cf-aig-metadata": '{"a":1}', "cf-aig-collect-log": "false",
        "cf-aig-request-timeout": "5000", "cf-aig-max-attempts": "2",
        "cf-aig-retry-delay": "10", "cf-aig-backoff": "linear"}
    assert request.headers["x-session-affinity"] == "s-1"
    assert fleet.seen[-1]["body"] == {"prompt": "wire", "options": {"rejectIfBusy": True}}
    assert ai.aiGatewayLogId is None  # collectLog: false


def test_upstream_and_gateway_errors_raise(fleet: Fleet) -> None:
    async def use(ai: AI) -> None:
        with pytest.raises(InferenceUpstreamError, match=f"^5007: No such model {UNSERVED}") as e:
            await ai.run(UNSERVED, {"prompt": "x"})
        assert (e.value.code, e.value.status, ai.lastRequestHttpStatusCode) == (5007, 400, 400)
        with pytest.raises(InferenceUpstreamError, match="^5007: ") as e:
            await ai.run("@cf/nobody/nothing", {"prompt": "x"}, {"gateway": {"id": "default"}})
        assert e.value.code == 5007
        with pytest.raises(AiGatewayLogNotFound):
            await ai.gateway("default").get_log("01JADMCQQQBWH3NXZ5GCRN98DP")

    fleet.call(use)


def test_bad_token_raises_10000(fleet: Fleet) -> None:
    async def use(ai: AI) -> None:
        with pytest.raises(InferenceUpstreamError, match="^10000: ") as e:
            await ai.run(MODEL, {"prompt": "x"})
        assert (e.value.code, e.value.status) == (10000, 401)
        with pytest.raises(InferenceUpstreamError, match="^10000: "):
            await ai.models()

    fleet.call(use, token="ef_not-a-real-token")


def test_models_and_gateway_urls(fleet: Fleet) -> None:
    async def use(ai: AI) -> tuple[list[dict], list[dict], AI]:
        return await ai.models(), await ai.models({"search": "smollm2"}), ai

    everything, found, ai = fleet.call(use)
    assert MODEL in {m["name"] for m in everything} and len(everything) > 1
    # SmolLM2, its precision variants and the miniature upcycled from it (search reads names
    # and descriptions, as Workers AI's does)
    names = [m["name"] for m in found]
    assert names[0] == MODEL and all("smollm2" in f"{m['name']} {m['description']}".lower()
                                     for m in found)
    assert len(names) < len(everything)
    assert found[0]["task"]["name"] == "Text Generation"
    gateway = ai.gateway("g1")
    assert gateway.get_url() == f"{fleet.base_url}/v1/{fleet.account_id}/g1"
    assert gateway.get_url("openai") == f"{fleet.base_url}/v1/{fleet.account_id}/g1/openai"


@pytest.mark.parametrize("name", ["@cf/a/b", "@cf/x?y=1", "@cf/x#frag", "@cf/../../internal/nodes",
                                  "@cf/with space", "@cf/50%/x", "..", "@cf/./x"])
def test_model_names_reach_the_gateway_as_written(serve, name: str) -> None:
    """Escaped per segment: the gateway's `{model:path}` route gets the name, nothing else."""
    routes = ("/client/v4/accounts/{account_id}/ai/run/{model:path}",
              "/v1/{account_id}/{gateway_id}/workers-ai/{model:path}")
    got: list[tuple[str, str, str]] = []

    async def record(request: Request) -> Response:
        got.append((request.path_params["account_id"], request.path_params["model"],
                    request.url.query))
        return JSONResponse({"result": {}, "success": True, "errors": [], "messages": []})

    app = Starlette(routes=[Route(path, record, methods=["POST"]) for path in routes])

    async def use(base_url: str) -> None:
        async with AI(base_url, "acct?#x", "token") as ai:
            await ai.run(name, {"prompt": "x"})
            await ai.run(name, {"prompt": "x"}, {"gateway": {"id": "default"}})

    with serve(app) as base_url:
        asyncio.run(use(base_url))
    assert got == [("acct?#x", name, "")] * 2
