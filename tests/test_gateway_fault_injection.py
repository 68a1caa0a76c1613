"""Fault injection over real HTTP: a gateway in front of a fake node fails calls as production
does when x-edgefire-fault or a gateway.yaml rule says so, and the `edgefire` binding and the
official `openai` client see each fault as the error the real one raises."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

import openai
import pytest

from edgefire import AI
from edgefire.contract.errors import ConfigError
from edgefire.contract.headers import FAULT
from edgefire.errors import InferenceUpstreamError
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState
from tests.gateway_fake_models import WORDS, ModelUpstream
from tests.gateway_fakes import gateway, heartbeat

SMOL = "@cf/huggingfacetb/smollm2-135m-instruct"
SMOL_INT4 = "@cf/huggingfacetb/smollm2-135m-instruct-int4"
SECRET = "s"
CHAT = [{"role": "user", "content": "Hi"}]
# fault -> (HTTP status, Cloudflare code, the openai client's exception class)
ERRORS = {
    "capacity": (429, 3040, openai.RateLimitError),
    "rate-limit": (429, 2003, openai.RateLimitError),
    "timeout": (408, 3007, openai.APIStatusError),  # 408 has no class of its own
    "server-error": (500, 3001, openai.InternalServerError),
}


@pytest.fixture
def start(serve, tmp_path):
    """start(faults=[rules], **settings) -> (gateway, fake node); injection on unless told."""
    with contextlib.ExitStack() as stack:
        def start(faults: list | None = None, **settings) -> tuple:
            node = ModelUpstream()
            node_url = stack.enter_context(serve(node))
            gw = stack.enter_context(gateway(
                serve, tmp_path, {"faults": faults} if faults else None, node_secret=SECRET,
                **{"fault_injection": True, **settings}))
            gw.beat(heartbeat(node_url, loaded_models={SMOL: {}, SMOL_INT4: {}}),
                    SECRET).raise_for_status()
            return gw, node

        yield start


@pytest.fixture
def fleet(start):
    return start()


def _ai(gw) -> AI:
    return AI(gw.url, gw.account_id, gw.token)


def _openai(gw) -> openai.OpenAI:
    # No client retries: each call is one request, so what the gateway did is what is seen.
    return openai.OpenAI(base_url=f"{gw.url}/client/v4/accounts/{gw.account_id}/ai/v1",
                         api_key=gw.token, max_retries=0)


async def _run(gw, model: str, inputs: dict, options: dict | None = None):
    async with _ai(gw) as ai:
        answer = await ai.run(model, inputs, options)
        if inputs.get("stream"):
            return [event async for event in answer]
        return answer


def _binding_error(gw, fault: str, options: dict | None = None) -> InferenceUpstreamError:
    options = {**(options or {}), "extraHeaders": {FAULT: fault}}
    with pytest.raises(InferenceUpstreamError) as caught:
        asyncio.run(_run(gw, SMOL, {"prompt": "Hi"}, options))
    return caught.value


@pytest.mark.parametrize("fault", list(ERRORS))
def test_each_fault_is_the_matching_error_in_the_binding_and_the_openai_client(fleet, fault):
    gw, node = fleet
    status, code, openai_error = ERRORS[fault]
    for options in (None, {"gateway": {"id": "default"}}):  # Workers AI REST and AI Gateway
        error = _binding_error(gw, fault, options)
        assert (error.status, error.code) == (status, code), str(error)
    with pytest.raises(openai.APIStatusError) as caught:
        _openai(gw).chat.completions.create(model=SMOL, messages=CHAT,
                                            extra_headers={FAULT: fault})
    assert type(caught.value) is openai_error
    assert (caught.value.status_code, caught.value.code) == (status, str(code))
    # Streamed requests fail the same way, before any event.
    with pytest.raises(openai_error):
        _openai(gw).chat.completions.create(model=SMOL, messages=CHAT, stream=True,
                                            extra_headers={FAULT: fault})
    assert not node.seen


def _routes(gw) -> dict[str, tuple[str, object]]:
    acct = f"/client/v4/accounts/{gw.account_id}/ai"
    base = f"/v1/{gw.account_id}/default"
    return {"native": (f"{acct}/run/{SMOL}", {"prompt": "Hi"}),
            "gateway": (f"{base}/workers-ai/{SMOL}", {"prompt": "Hi"}),
            "universal": (base, [{"provider": "workers-ai", "endpoint": SMOL,
                                  "query": {"prompt": "Hi"}}]),
            "openai": (f"{acct}/v1/chat/completions", {"model": SMOL, "messages": CHAT}),
            "gateway-openai": (f"{base}/workers-ai/v1/chat/completions",
                               {"model": SMOL, "messages": CHAT}),
            "compat": (f"{base}/compat/chat/completions",
                       {"model": f"workers-ai/{SMOL}", "messages": CHAT})}


@pytest.mark.parametrize("fault", list(ERRORS))
def test_each_fault_comes_in_the_shape_of_every_route(fleet, fault):
    gw, node = fleet
    status, code, _ = ERRORS[fault]
    with gw.client() as client:
        for route, (path, body) in _routes(gw).items():
            response = client.post(path, json=body, headers={FAULT: fault})
            assert response.status_code == status, (route, response.text)
            data = response.json()
            if route in ("openai", "gateway-openai", "compat"):
                assert data["error"]["code"] == str(code), route
            else:
                assert data["errors"][0]["code"] == code, route
    assert not node.seen


def test_a_stream_cut_is_an_incomplete_stream(fleet):
    gw, node = fleet
    cut = {FAULT: "stream-cut"}
    events = asyncio.run(_run(gw, SMOL, {"prompt": "Hi", "stream": True},
                              {"extraHeaders": cut}))
    # Three whole events, then the error a dropped node connection gives; never [DONE].
    assert [e.get("response") for e in events[:3]] == WORDS[:3] and len(events) == 4
    assert events[3]["errors"] == [{"code": 3040, "message":
                                    "upstream failed mid-stream: RemoteProtocolError"}]
    with gw.client() as client:
        raw = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                          json={"prompt": "Hi", "stream": True}, headers=cut)
    assert raw.status_code == 200 and "[DONE]" not in raw.text and raw.text.endswith("\n\n")
    chunks = []
    with pytest.raises(openai.APIError, match="upstream failed mid-stream"):
        for chunk in _openai(gw).chat.completions.create(model=SMOL, messages=CHAT,
                                                         stream=True, extra_headers=cut):
            chunks.append(chunk.choices[0].delta.content)
    assert chunks == WORDS[:3]
    assert len(node.seen) == 3  # the node did answer: the cut is on the way back


def test_a_stream_cut_of_an_unstreamed_answer_fails_mid_response(fleet):
    gw, _ = fleet
    error = _binding_error(gw, "stream-cut")
    assert (error.status, error.code) == (429, 3040)
    assert "upstream failed mid-response" in str(error)


def test_added_latency_delays_the_answer_and_a_fault(fleet):
    gw, node = fleet
    began = time.perf_counter()
    answer = asyncio.run(_run(gw, SMOL, {"prompt": "Hi"}, {"extraHeaders": {FAULT: "latency=250"}}))
    assert time.perf_counter() - began >= 0.25 and answer["response"] == "".join(WORDS)
    began = time.perf_counter()
    completion = _openai(gw).chat.completions.create(model=SMOL, messages=CHAT,
                                                     extra_headers={FAULT: "latency=250"})
    assert time.perf_counter() - began >= 0.25 and completion.choices[0].message.content
    began = time.perf_counter()
    with pytest.raises(openai.InternalServerError):
        _openai(gw).chat.completions.create(model=SMOL, messages=CHAT,
                                            extra_headers={FAULT: "latency=200,server-error"})
    assert time.perf_counter() - began >= 0.2
    assert len(node.seen) == 2


def test_latency_counts_toward_the_request_timeout_and_is_retried(fleet):
    gw, node = fleet
    error = _binding_error(gw, "latency=300", {"gateway": {"id": "default",
                                                            "requestTimeoutMs": 100}})
    assert (error.status, error.code) == (408, 3007)
    assert not node.seen  # the attempt was cancelled before it reached the node


def test_rules_fail_every_nth_call_and_the_gateway_retries_them(start):
    gw, node = start([{"model": SMOL, "fault": "capacity", "every": 2}])
    url = f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}"
    with gw.client() as client:
        statuses = [client.post(url, json={"prompt": "Hi"}).status_code for _ in range(3)]
        assert statuses == [200, 429, 200]
        # Call 4 fails, its retry (call 5) is answered.
        retried = client.post(url, json={"prompt": "Hi"}, headers={"cf-aig-max-attempts": "2"})
    assert retried.status_code == 200 and len(node.seen) == 3


def test_timeouts_are_retried_and_the_gateway_rate_limit_is_not(start):
    gw, node = start([{"model": SMOL, "fault": "timeout", "every": 2},
                      {"model": SMOL_INT4, "fault": "rate-limit", "every": 2}])
    retry = {"cf-aig-max-attempts": "2"}
    with gw.client() as client:
        for model in (SMOL, SMOL_INT4):
            url = f"/client/v4/accounts/{gw.account_id}/ai/run/{model}"
            assert client.post(url, json={"prompt": "Hi"}).status_code == 200
            second = client.post(url, json={"prompt": "Hi"}, headers=retry)
            if model == SMOL:  # the timed-out attempt is retried, and answered
                assert second.status_code == 200
            else:  # the gateway's rate limit ends the request
                assert second.json()["errors"][0]["code"] == 2003
    assert [rule.calls for rule in gw.state.pipeline.faults.rules] == [3, 2]
    assert len(node.seen) == 3


def test_a_failed_step_falls_back_to_the_next(fleet):
    gw, node = fleet
    steps = [{"provider": "workers-ai", "endpoint": SMOL, "query": {"prompt": "Hi"},
              "headers": {FAULT: "server-error"}},
             {"provider": "workers-ai", "endpoint": SMOL_INT4, "query": {"prompt": "Hi"}}]
    with gw.client() as client:
        response = client.post(f"/v1/{gw.account_id}/default", json=steps)
    assert response.status_code == 200 and response.headers["cf-aig-step"] == "1"
    assert [s.path.rsplit("/", 1)[1] for s in node.seen] == [SMOL_INT4.rsplit("/", 1)[1]]


def test_rules_apply_per_model_and_aliases_match(start):
    gw, _ = start([{"model": "@cf/smollm2-135m-instruct", "fault": "server-error"}])
    with gw.client() as client:
        for model, status in ((SMOL, 500), ("@cf/smollm2-135m-instruct", 500),
                              (SMOL_INT4, 200)):
            response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{model}",
                                   json={"prompt": "Hi"})
            assert response.status_code == status, model


def test_a_seeded_probability_rule_is_deterministic(start):
    rule = {"fault": "capacity", "probability": 0.5, "seed": 7}
    draws = random.Random(7)
    expected = [429 if draws.random() < 0.5 else 200 for _ in range(12)]
    assert 200 in expected and 429 in expected
    for _ in range(2):  # two gateways, the same outcomes
        gw, _ = start([rule])
        with gw.client() as client:
            got = [client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                               json={"prompt": "Hi"}).status_code for _ in range(12)]
        assert got == expected


def test_off_the_header_is_refused_not_ignored(start):
    gw, node = start(fault_injection=False)
    error = _binding_error(gw, "capacity")
    assert (error.status, error.code) == (400, 5006)
    assert "EDGEFIRE_FAULT_INJECTION" in str(error)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw).chat.completions.create(model=SMOL, messages=CHAT,
                                            extra_headers={FAULT: "latency=10"})
    assert caught.value.body["param"] == FAULT
    assert not node.seen
    assert asyncio.run(_run(gw, SMOL, {"prompt": "Hi"}))["response"]  # without it: answered


def test_off_rules_stop_the_gateway_from_starting(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text('faults: [{fault: capacity}]\n')
    with pytest.raises(ConfigError, match="EDGEFIRE_FAULT_INJECTION"):
        GatewayState.build(GatewaySettings(gateway_config=config, redis_url=None),
                           db=Database(":memory:"))


@pytest.mark.parametrize("value", ["explode", "capacity,timeout", "latency=abc", "latency=-5",
                                   "latency=700000", "", "latency=1,latency=2"])
def test_a_bad_fault_header_is_5006_before_any_call(fleet, value):
    gw, node = fleet
    with gw.client() as client:
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                               json={"prompt": "Hi"}, headers={FAULT: value})
    assert response.status_code == 400 and response.json()["errors"][0]["code"] == 5006
    assert FAULT in response.json()["errors"][0]["message"]
    assert not node.seen


@pytest.mark.parametrize("rule", [{"fault": "capacity", "every": 0},
                                  {"fault": "capacity", "every": 2, "probability": 0.5},
                                  {"fault": "capacity", "probability": 1.5},
                                  {"fault": "explode"}, {"model": SMOL},
                                  {"fault": "capacity", "when": "always"}])
def test_a_bad_rule_stops_the_gateway_from_starting(tmp_path, rule):
    config = tmp_path / "gateway.yaml"
    config.write_text(json.dumps({"faults": [rule]}))  # JSON is YAML
    with pytest.raises(ConfigError, match=r"faults\[0\]"):
        GatewayState.build(GatewaySettings(gateway_config=config, redis_url=None,
                                           fault_injection=True), db=Database(":memory:"))


def test_an_injected_answer_is_byte_for_byte_the_readme_example(fleet):
    gw, _ = fleet
    with gw.client() as client:
        response = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{SMOL}",
                               json={"prompt": "Hi"}, headers={FAULT: "capacity"})
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert f"# HTTP/1.1 429 … {response.text}\n" in readme
