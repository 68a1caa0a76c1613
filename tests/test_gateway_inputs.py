"""The gateway's own inputs over real HTTP (no node): bad ones are 5006 in the envelope, never
a 500. Each case here was a 500 (3001) before its schema or parser said no."""

from __future__ import annotations

import json

import httpx
import pytest

from edgefire.gateway.app import create_app
from edgefire.gateway.db import Database
from edgefire.gateway.settings import GatewaySettings
from edgefire.gateway.state import GatewayState

SECRET = "s3cret"


@pytest.fixture(scope="module")
def gateway(serve):
    settings = GatewaySettings(node_secret=SECRET, heartbeat_timeout_s=3600)
    state = GatewayState.build(settings, db=Database(":memory:"))
    account_id = state.accounts.create_account("inputs").id
    _, token = state.accounts.create_token(account_id)
    with serve(create_app(state)) as base_url, httpx.Client(
            base_url=base_url, headers={"authorization": f"Bearer {token}"}) as client:
        yield client, f"/client/v4/accounts/{account_id}", f"/v1/{account_id}/default"


def _message(response: httpx.Response) -> str:
    """The message of a 5006 envelope (a schema's names the field first)."""
    assert response.status_code == 400, response.text
    [error] = response.json()["errors"]
    assert error["code"] == 5006, error
    return error["message"]


def test_settings_past_what_sqlite_holds_are_5006(gateway):
    client, account, _ = gateway
    body = {"id": "huge", "rate_limiting_limit": 2**70, "rate_limiting_interval": 60}
    response = client.post(f"{account}/ai-gateway/gateways", json=body)
    assert _message(response).startswith("rate_limiting_limit ")
    client.post(f"{account}/ai-gateway/gateways", json={"id": "fine"}).raise_for_status()
    response = client.put(f"{account}/ai-gateway/gateways/fine",
                          json={"rate_limiting_interval": 2**70})
    assert _message(response).startswith("rate_limiting_interval ")


def test_a_log_page_in_other_digits_is_5006(gateway):
    client, account, _ = gateway
    client.post(f"{account}/ai-gateway/gateways", json={"id": "logged"}).raise_for_status()
    response = client.get(f"{account}/ai-gateway/gateways/logged/logs", params={"page": "²"})
    assert _message(response).startswith("page ")


def test_universal_step_headers_that_are_no_object_are_5006(gateway):
    client, _, universal = gateway
    steps = [{"provider": "workers-ai", "endpoint": "@cf/x", "headers": ["not", "an", "object"]}]
    assert _message(client.post(universal, json=steps)).startswith("body[0].headers ")


def test_json_nested_past_the_recursion_limit_is_5006(gateway):
    client, _, universal = gateway
    response = client.post(universal, content=b"[" * 100_000 + b"]" * 100_000)
    assert _message(response) == "the request body is not valid JSON"


def test_a_heartbeat_with_an_unpaired_surrogate_is_refused(gateway):
    client, _, _ = gateway
    beat = {"city": "zzz", "url": "http://127.0.0.1:1", "lat": 0, "lon": 0,
            "memory_budget_bytes": 1, "accelerator_bytes": 0}
    raw = json.dumps(beat).replace('"zzz"', '"\\ud800"').encode()
    response = client.post("/internal/nodes/heartbeat", content=raw,
                           headers={"x-edgefire-node-secret": SECRET})
    assert _message(response) == "the request body is not valid JSON"
    # Accepted, the city made every later answer that names it unencodable: a 500.
    health = client.get("/health")  # 503 only because no node is registered
    assert health.status_code == 503 and health.json()["status"] == "no_nodes"


@pytest.mark.parametrize("header, value", [
    ("cf-aig-metadata", "[" * 5000 + "]" * 5000),  # RecursionError in json.loads
    ("cf-aig-custom-cost", "[" * 5000 + "]" * 5000),
    ("cf-aig-metadata", '{"a": [1]}'),
    ("cf-aig-cache-ttl", "9" * 5000),  # past the digits int() takes
])
def test_bad_gateway_headers_are_5006_before_any_upstream_call(gateway, header, value):
    client, _, gateway_url = gateway
    # No node is registered: a call upstream would answer 429 3040, so a 400 shows the header
    # was refused first.
    response = client.post(f"{gateway_url}/workers-ai/@cf/huggingfacetb/smollm2-135m-instruct",
                           json={"prompt": "hi"}, headers={header: value})
    assert header in _message(response)
