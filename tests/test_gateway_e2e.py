"""The gateway in front of two real edge nodes (Frankfurt and Singapore) over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
import yaml

from edgefire.contract.cities import load_city
from edgefire.contract.headers import WEIGHT_PRECISION
from edgefire.gateway.app import create_app as create_gateway_app
from edgefire.gateway.cache import MemoryCache
from edgefire.gateway.db import Database
from edgefire.gateway.ratelimit import RedisRateLimiter
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from edgefire.runtime.node.node import EdgeNode
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.server.app import create_app as create_node_app
from edgefire.runtime.weight_precision import compute_precision
from tests.conftest import free_port
from tests.redis_support import REDIS_URL, needs_redis

pytestmark = pytest.mark.slow

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"


class Fleet:
    def __init__(self, serve, tmp_path) -> None:
        self.stack = contextlib.ExitStack()
        self.node_stacks: dict[str, contextlib.ExitStack] = {}
        gateway_port = free_port()
        self.gateway_url = f"http://127.0.0.1:{gateway_port}"
        dead_port = free_port()  # nothing listens there: a provider that always fails
        config = tmp_path / "gateway.yaml"
        self.nodes: dict[str, EdgeNode] = {}
        for city in ("fra", "sin"):
            port = free_port()
            settings = NodeSettings(gateway_url=self.gateway_url, kv_cache_mib=64,
                                    public_url=f"http://127.0.0.1:{port}",
                                    heartbeat_interval_s=0.2)
            self.nodes[city] = EdgeNode(load_city(city), settings)
            stack = contextlib.ExitStack()
            stack.enter_context(serve(create_node_app(self.nodes[city]), port))
            self.node_stacks[city] = stack
            if city == "sin":
                self.sin_url = f"http://127.0.0.1:{port}"
        config.write_text(yaml.safe_dump({"providers": {
            "broken": {"type": "openai-compatible", "base_url": f"http://127.0.0.1:{dead_port}"},
            "sin-openai": {"type": "openai-compatible",
                           "base_url": f"{self.sin_url}/client/v4/accounts/upstream/ai"},
        }}))
        settings = GatewaySettings(gateway_config=config, heartbeat_timeout_s=1.0)
        self.state = GatewayState.build(settings, db=Database(":memory:"))
        self.stack.enter_context(serve(create_gateway_app(self.state), gateway_port))
        self.accounts = {}
        for name in ("a", "b"):
            account = self.state.accounts.create_account(name)
            _, token = self.state.accounts.create_token(account.id)
            self.accounts[name] = (account.id, token)
        deadline = time.monotonic() + 30
        while len(self.state.directory.healthy()) < 2:
            assert time.monotonic() < deadline, "nodes did not register"
            time.sleep(0.05)

    def client(self, who: str = "a") -> tuple[str, httpx.Client]:
        account_id, token = self.accounts[who]
        return account_id, httpx.Client(base_url=self.gateway_url, timeout=120,
                                        headers={"authorization": f"Bearer {token}"})

    def kill(self, city: str) -> None:
        self.node_stacks.pop(city).close()

    def close(self) -> None:
        for stack in self.node_stacks.values():
            stack.close()
        self.stack.close()


@pytest.fixture(scope="module")
def fleet(serve, tmp_path_factory):
    fleet = Fleet(serve, tmp_path_factory.mktemp("gateway"))
    yield fleet
    fleet.close()


def _run(client: httpx.Client, account_id: str, gateway: str = "default", country: str = "DE",
         headers: dict | None = None, **body) -> httpx.Response:
    body = {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0, **body}
    return client.post(f"/v1/{account_id}/{gateway}/workers-ai/{SMOL}", json=body,
                       headers={"cf-ipcountry": country, **(headers or {})})


def _log(fleet: Fleet, account_id: str, response: httpx.Response, gateway: str = "default"):
    return fleet.state.logs.get(account_id, gateway, response.headers["cf-aig-log-id"])


def test_bad_tokens_are_rejected(fleet):
    account_id, _ = fleet.accounts["a"]
    url = f"{fleet.gateway_url}/client/v4/accounts/{account_id}/ai/run/{SMOL}"
    for headers in ({}, {"authorization": "Bearer ef_wrong"}):
        response = httpx.post(url, json={"prompt": "x"}, headers=headers)
        assert response.status_code == 401 and response.json()["errors"][0]["code"] == 10000
    _, b = fleet.client("b")
    assert b.post(f"/client/v4/accounts/{account_id}/ai/run/{SMOL}",
                  json={"prompt": "x"}).status_code == 403
    revoked_info, revoked = fleet.state.accounts.create_token(account_id, "short-lived")
    fleet.state.accounts.revoke_token(revoked_info.id)
    assert httpx.post(url, json={"prompt": "x"},
                      headers={"authorization": f"Bearer {revoked}"}).status_code == 401


def test_routing_picks_the_nearest_node_and_logs_tokens_and_cost(fleet):
    account_id, client = fleet.client()
    for country, city in (("DE", "fra"), ("SG", "sin"), ("FR", "fra"), ("JP", "sin")):
        response = _run(client, account_id, country=country)
        assert response.status_code == 200, response.text
        record = _log(fleet, account_id, response)
        assert record.node == city, (country, record.node)
        assert response.headers[WEIGHT_PRECISION] == compute_precision(NodeSettings().dtype)
        assert record.tokens_in > 0 and record.tokens_out > 0 and record.cost > 0
    logs = client.get(f"/client/v4/accounts/{account_id}/ai-gateway/gateways/default/logs")
    assert logs.json()["result_info"]["total_count"] >= 4


def test_cache_hit_miss_skip_and_expiry(fleet):
    account_id, client = fleet.client()
    clock = [1000.0]
    fleet.state.pipeline.cache = MemoryCache(clock=lambda: clock[0])
    key = {"cf-aig-cache-ttl": "60"}
    first, second = (_run(client, account_id, headers=key) for _ in range(2))
    assert first.headers["cf-aig-cache-status"] == "MISS"
    assert second.headers["cf-aig-cache-status"] == "HIT" and second.content == first.content
    assert _log(fleet, account_id, second).cached
    skipped = _run(client, account_id, headers={**key, "cf-aig-skip-cache": "true"})
    assert skipped.headers["cf-aig-cache-status"] == "MISS"
    clock[0] += 61
    assert _run(client, account_id, headers=key).headers["cf-aig-cache-status"] == "MISS"


def test_one_account_never_sees_another_accounts_data(fleet):
    a_id, a = fleet.client("a")
    b_id, b = fleet.client("b")
    fleet.state.pipeline.cache = MemoryCache()
    custom = {"cf-aig-cache-key": "shared-name"}
    assert _run(a, a_id, headers=custom).headers["cf-aig-cache-status"] == "MISS"
    assert _run(b, b_id, headers=custom).headers["cf-aig-cache-status"] == "MISS"
    a.post(f"/client/v4/accounts/{a_id}/ai-gateway/gateways", json={"id": "private"})
    base = f"/client/v4/accounts/{a_id}/ai-gateway/gateways/private"
    assert b.get(base).status_code == 403  # b's token on a's account
    b_base = f"/client/v4/accounts/{b_id}/ai-gateway/gateways/private"
    assert b.get(b_base).status_code == 404  # a's gateway is not b's
    assert b.get(f"{b_base}/logs").status_code == 404
    a_logs = a.get(f"/client/v4/accounts/{a_id}/ai-gateway/gateways/default/logs").json()
    b_logs = b.get(f"/client/v4/accounts/{b_id}/ai-gateway/gateways/default/logs").json()
    assert {r["id"] for r in a_logs["result"]}.isdisjoint(r["id"] for r in b_logs["result"])


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=needs_redis)])
def test_rate_limit_holds_under_concurrent_requests(fleet, backend, request):
    account_id, token = fleet.accounts["a"]
    gateway = f"limited-{backend}"
    _, client = fleet.client()
    client.post(f"/client/v4/accounts/{account_id}/ai-gateway/gateways",
                json={"id": gateway, "rate_limiting_limit": 5, "rate_limiting_interval": 60})
    if backend == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        fleet.state.pipeline.limiter = RedisRateLimiter(REDIS_URL, prefix=prefix)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=fleet.gateway_url, timeout=120,
                                     headers={"authorization": f"Bearer {token}"}) as http:
            responses = await asyncio.gather(*(http.post(
                f"/v1/{account_id}/{gateway}/workers-ai/{SMOL}",
                json={"prompt": f"count {i}", "max_tokens": 1}) for i in range(12)))
        return [r.status_code for r in responses]

    statuses = asyncio.run(burst())
    assert statuses.count(200) == 5 and statuses.count(429) == 7, statuses


def test_universal_endpoint_falls_back_after_a_failing_step(fleet):
    account_id, client = fleet.client()
    steps = [
        {"provider": "broken", "endpoint": "v1/chat/completions",
         "query": {"model": SMOL, "messages": [{"role": "user", "content": "hi"}]}},
        {"provider": "workers-ai", "endpoint": SMOL,
         "query": {"prompt": "Say hi.", "max_tokens": 4}},
    ]
    response = client.post(f"/v1/{account_id}/default", json=steps)
    assert response.status_code == 200, response.text
    assert response.headers["cf-aig-step"] == "1"
    assert response.json()["result"]["response"]
    assert _log(fleet, account_id, response).step == 1


def test_openai_compatible_upstream_and_compat_endpoint(fleet):
    account_id, client = fleet.client()
    messages = [{"role": "user", "content": "Say hi."}]
    via_provider = client.post(f"/v1/{account_id}/default/sin-openai/v1/chat/completions",
                               json={"model": SMOL, "messages": messages, "max_tokens": 4})
    assert via_provider.status_code == 200, via_provider.text
    compat = client.post(f"/v1/{account_id}/default/compat/chat/completions",
                         json={"model": f"workers-ai/{SMOL}", "messages": messages,
                               "max_tokens": 4, "temperature": 0})
    assert compat.json()["choices"][0]["message"]["content"]


def test_streaming_passes_through_without_buffering(fleet):
    account_id, client = fleet.client()
    arrivals = []
    started = time.perf_counter()
    with client.stream("POST", f"/v1/{account_id}/default/workers-ai/{SMOL}",
                       json={"prompt": "Count from one to fifty.", "max_tokens": 64,
                             "stream": True, "temperature": 0},
                       headers={"cf-ipcountry": "DE"}) as response:
        assert response.headers[WEIGHT_PRECISION]  # the node's, passed on before the body
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter() - started)
    assert len(arrivals) > 10
    # The first event reaches the client long before the last token exists.
    assert arrivals[0] < arrivals[-1] / 2


def test_a_killed_node_stops_receiving_traffic_and_its_request_is_retried(fleet):
    account_id, client = fleet.client()
    fleet.kill("fra")  # still in the directory until its heartbeats are missed
    response = _run(client, account_id, country="DE")
    assert response.status_code == 200, response.text
    assert _log(fleet, account_id, response).node == "sin"
    time.sleep(1.5)  # past the heartbeat timeout
    assert [n.city for n in fleet.state.directory.healthy()] == ["sin"]
    assert _log(fleet, account_id, _run(client, account_id, country="DE")).node == "sin"


def test_json_mode_tool_calls_and_a_batch_through_the_gateway_with_the_binding(fleet):
    import jsonschema_rs

    from edgefire import AI

    account_id, token = fleet.accounts["a"]
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name", "age"], "additionalProperties": False}
    weather = {"name": "get_weather", "description": "The weather in a city",
               "parameters": {"type": "object", "properties": {
                   "city": {"type": "string", "maxLength": 24}}, "required": ["city"],
                   "additionalProperties": False}}

    async def scenario() -> tuple[dict, dict, dict]:
        async with AI(fleet.gateway_url, account_id, token) as ai:
            json_mode = await ai.run(SMOL, {
                "messages": [{"role": "user", "content": "A person as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": person},
                "max_tokens": 64, "temperature": 0}, {"gateway": {"id": "default"}})
            called = await ai.run(SMOL, {
                "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                "tools": [weather], "tool_choice": "required", "parallel_tool_calls": False,
                "max_tokens": 64, "temperature": 0})
            queued = await ai.run(SMOL, {"requests": [
                {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0},
                {"prompt": "Say bye.", "max_tokens": 4, "external_reference": "bye"}]},
                {"queueRequest": True})
            assert queued["status"] == "queued"
            for _ in range(300):
                polled = await ai.run(SMOL, {"request_id": queued["request_id"]})
                if "responses" in polled:
                    break
                await asyncio.sleep(0.1)
        return json_mode, called, polled

    json_mode, called, polled = asyncio.run(scenario())
    assert jsonschema_rs.validator_for(person).is_valid(json_mode["response"])
    [call] = called["tool_calls"]
    assert call["name"] == "get_weather" and called["finish_reason"] == "tool_calls"
    assert jsonschema_rs.validator_for(weather["parameters"]).is_valid(call["arguments"])
    first, second = polled["responses"]
    assert first["success"] and first["result"]["response"] and first["id"] == 0
    assert second["external_reference"] == "bye" and second["result"]["usage"]
    assert polled["usage"]["total_tokens"] == sum(
        r["result"]["usage"]["total_tokens"] for r in polled["responses"])


def test_a_stream_the_client_leaves_is_logged_with_its_tokens_and_cost(fleet):
    account_id, client = fleet.client()
    url = f"/v1/{account_id}/default/workers-ai/{SMOL}"
    with client.stream("POST", url, json={"prompt": "Tell a long story.", "stream": True,
                                          "max_tokens": 200, "temperature": 0}) as response:
        log_id = response.headers["cf-aig-log-id"]
        events = 0
        for line in response.iter_lines():
            events += line.startswith('data: {"response":"') and line != 'data: {"response":""}'
            if events == 5:
                break  # the client leaves mid-answer: no usage event reaches the gateway
    deadline = time.monotonic() + 10
    while (record := fleet.state.logs.get(account_id, "default", log_id)) is None:
        assert time.monotonic() < deadline, "the stream's log was not written"
        time.sleep(0.05)
    assert record.tokens_in > 0 and 5 <= record.tokens_out < 200 and record.cost > 0
