"""One request, bounded upstream work, over real HTTP: capped steps and attempts, every
attempt charged to the rate limit, and the node's request closed when the caller's timeout
fires or the caller goes away (so the node can stop generating)."""

from __future__ import annotations

import httpx
import pytest

from edgefire.gateway.pipeline import MAX_ATTEMPTS
from edgefire.gateway.schemas import MAX_STEPS
from tests.gateway_fakes import MODEL, RecordingUpstream, gateway, heartbeat

SECRET = "s"
CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def failing(serve, tmp_path):
    """A gateway whose provider `up` always answers 503, and an authenticated client."""
    fake = RecordingUpstream(status=503)
    with serve(fake) as fake_url:
        config = {"providers": {"up": {"type": "openai-compatible", "base_url": fake_url}}}
        with gateway(serve, tmp_path, config, node_secret=SECRET) as gw, gw.client() as client:
            yield gw, fake, client


def _step(**config) -> dict:
    return {"provider": "up", "endpoint": "chat/completions", "query": CHAT, "config": config}


def test_steps_are_capped(failing):
    gw, fake, client = failing
    refused = client.post(f"/v1/{gw.account_id}/default", json=[_step()] * (MAX_STEPS + 1))
    assert refused.status_code == 400, refused.text
    error = refused.json()["errors"][0]
    assert error["code"] == 5006 and f"at most {MAX_STEPS} items" in error["message"]
    assert fake.seen == []


def test_attempts_over_all_steps_are_capped_before_any_call(failing):
    gw, fake, client = failing
    steps = [_step(maxAttempts=4)] * 3  # 12 > MAX_ATTEMPTS
    refused = client.post(f"/v1/{gw.account_id}/default", json=steps)
    assert refused.status_code == 400, refused.text
    error = refused.json()["errors"][0]
    assert error["code"] == 5006 and f"at most {MAX_ATTEMPTS}" in error["message"]
    assert "body[2]" in error["message"]
    assert fake.seen == []
    within = client.post(f"/v1/{gw.account_id}/default", json=[_step(maxAttempts=5)] * 2)
    assert within.status_code == 503 and len(fake.seen) == MAX_ATTEMPTS


def test_every_upstream_attempt_is_charged_to_the_rate_limit(failing):
    gw, fake, client = failing
    client.post(f"/client/v4/accounts/{gw.account_id}/ai-gateway/gateways",
                json={"id": "limited", "rate_limiting_limit": 3,
                      "rate_limiting_interval": 3600}).raise_for_status()
    url = f"/v1/{gw.account_id}/limited/up/chat/completions"
    limited = client.post(url, json=CHAT, headers={"cf-aig-max-attempts": "5"})
    # The request's charge covers its first attempt; attempts 2 and 3 use up the limit and
    # the 4th is refused: three upstream calls, not five.
    assert limited.status_code == 429 and limited.json()["errors"][0]["code"] == 2003
    assert len(fake.seen) == 3
    assert client.post(url, json=CHAT).status_code == 429 and len(fake.seen) == 3


@pytest.fixture
def hanging_node(serve, tmp_path):
    """A gateway in front of a node that never answers a request whose body says hang."""
    node = RecordingUpstream()
    with serve(node) as node_url, gateway(serve, tmp_path, node_secret=SECRET) as gw:
        gw.beat(heartbeat(node_url), SECRET).raise_for_status()
        yield gw, node


def test_the_request_timeout_closes_the_nodes_request(hanging_node):
    gw, node = hanging_node
    with gw.client() as client:
        timed_out = client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{MODEL}",
                                json={"prompt": "hi", "hang": True},
                                headers={"cf-aig-request-timeout": "200"})
    assert timed_out.status_code == 408 and timed_out.json()["errors"][0]["code"] == 3007
    assert node.disconnected.wait(timeout=10), "the node's request was left open"


def test_a_client_that_goes_away_closes_the_nodes_request(hanging_node):
    gw, node = hanging_node
    with gw.client(timeout=httpx.Timeout(30, read=0.5)) as client, \
            pytest.raises(httpx.ReadTimeout):
        client.post(f"/client/v4/accounts/{gw.account_id}/ai/run/{MODEL}",
                    json={"prompt": "hi", "hang": True})
    assert len(node.seen) == 1
    assert node.disconnected.wait(timeout=10), "the node kept generating for nobody"
