"""Who may steer the gateway, over real HTTP: node credentials and city binding, node URLs,
the admin-only node list, heartbeat bounds, health, authenticated gateways, session pins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from edgefire.contract.errors import ConfigError
from edgefire.gateway.node_auth import NodeCredentials
from tests.conftest import free_port
from tests.gateway_fakes import MODEL, RecordingUpstream, gateway, heartbeat

ROOT = Path(__file__).resolve().parent.parent
FLEET, FRA = "fleet-secret", "fra-own-secret"
RUN = "/client/v4/accounts/{}/ai/run/" + MODEL


def _error(response: httpx.Response) -> dict:
    return response.json()["errors"][0]


@pytest.fixture
def secured(serve, tmp_path, monkeypatch):
    """A gateway with a fleet secret, fra's own credential and an admin token; a fake node."""
    monkeypatch.setenv("EF_TEST_FRA_SECRET", FRA)
    config = {"nodes": {"fra": {"secret_env": "EF_TEST_FRA_SECRET"}}}
    node = RecordingUpstream()
    with serve(node) as node_url, gateway(serve, tmp_path, config, node_secret=FLEET,
                                          admin_token="admin-tok") as gw:
        yield gw, node, node_url


def test_start_refuses_without_node_credentials(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFIRE_")}
    env |= {"EDGEFIRE_GATEWAY_DB": str(tmp_path / "gw.db"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "edgefire.gateway.cli", "start", "--port",
                           str(free_port())], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no node credentials" in lines[0], done.stderr
    assert "EDGEFIRE_NODE_SECRET" in lines[0]


def test_per_node_credentials_must_name_a_set_variable():
    with pytest.raises(ConfigError, match="EF_UNSET"):
        NodeCredentials.load(None, {"fra": {"secret_env": "EF_UNSET"}}, environ={})
    with pytest.raises(ConfigError, match="secret_env"):
        NodeCredentials.load(None, {"fra": {"secret": "inline"}}, environ={})


def test_heartbeats_need_a_credential_and_a_city_keeps_its_own(secured):
    gw, _, node_url = secured
    for secret in (None, "wrong"):
        refused = gw.beat(heartbeat(node_url, "sin"), secret)
        assert refused.status_code == 401 and _error(refused)["code"] == 10000
    # fra has a credential of its own: the fleet secret cannot report as fra.
    refused = gw.beat(heartbeat("http://203.0.113.9:80", "fra"), FLEET)
    assert refused.status_code == 403 and refused.json()["success"] is False
    assert gw.beat(heartbeat(node_url, "fra"), FRA).status_code == 200
    assert gw.state.directory.nodes()[0].url == node_url


def test_a_live_city_cannot_be_taken_over_by_another_credential(secured):
    gw, _, node_url = secured
    assert gw.beat(heartbeat(node_url, "sin"), FRA).status_code == 200  # binds sin to fra's
    takeover = gw.beat(heartbeat("http://203.0.113.9:80", "sin"), FLEET)
    assert takeover.status_code == 403 and "bound" in _error(takeover)["message"]
    assert [n.url for n in gw.state.directory.nodes()] == [node_url]


def test_the_gateway_calls_each_node_with_its_citys_credential(secured):
    gw, node, node_url = secured
    gw.beat(heartbeat(node_url, "fra"), FRA).raise_for_status()
    with gw.client() as client:
        assert client.post(RUN.format(gw.account_id), json={"prompt": "hi"}).status_code == 200
    assert node.seen[-1].headers["x-edgefire-node-secret"] == FRA
    gw.beat(heartbeat(node_url, "fra", status="starting"), FRA).raise_for_status()
    gw.beat(heartbeat(node_url, "lhr"), FLEET).raise_for_status()
    with gw.client() as client:
        assert client.post(RUN.format(gw.account_id), json={"prompt": "hi"}).status_code == 200
    assert node.seen[-1].headers["x-edgefire-node-secret"] == FLEET


@pytest.mark.parametrize("url", ["http://127.0.0.1:8801/?steal=1", "http://u:p@127.0.0.1:1",
                                 "http://127.0.0.1:99999", "gopher://127.0.0.1:70"])
def test_node_urls_are_validated(secured, url):
    gw, _, _ = secured
    refused = gw.beat(heartbeat(url, "sin"), FLEET)
    assert refused.status_code == 400 and _error(refused)["code"] == 5006
    assert gw.state.directory.nodes() == []


def test_heartbeat_size_and_node_count_are_bounded(serve, tmp_path):
    with gateway(serve, tmp_path, node_secret=FLEET, max_nodes=1) as gw:
        big = heartbeat("http://127.0.0.1:8801", "fra", name="x" * (70 << 10))
        too_large = gw.beat(big, FLEET)
        assert too_large.status_code == 413 and _error(too_large)["code"] == 3006
        assert gw.beat(heartbeat("http://127.0.0.1:8801", "fra"), FLEET).status_code == 200
        refused = gw.beat(heartbeat("http://127.0.0.1:8802", "sin"), FLEET)
        assert refused.status_code == 400 and "EDGEFIRE_MAX_NODES" in _error(refused)["message"]


def test_the_node_list_needs_the_admin_token(secured, serve, tmp_path):
    gw, _, node_url = secured
    gw.beat(heartbeat(node_url, "fra"), FRA).raise_for_status()
    url = f"{gw.url}/internal/nodes"
    for headers in ({}, {"authorization": "Bearer wrong"},
                    {"authorization": f"Bearer {gw.token}"}):  # an account token is not admin
        refused = httpx.get(url, headers=headers)
        assert refused.status_code == 401 and _error(refused)["code"] == 10000
    listed = httpx.get(url, headers={"authorization": "Bearer admin-tok"})
    assert listed.status_code == 200 and listed.json()["nodes"][0]["url"] == node_url
    with gateway(serve, tmp_path, node_secret=FLEET) as no_admin:  # no token set: never open
        assert httpx.get(f"{no_admin.url}/internal/nodes").status_code == 401


def test_health_says_when_no_node_can_serve(secured):
    gw, _, node_url = secured
    empty = httpx.get(f"{gw.url}/health")
    assert empty.status_code == 503
    assert empty.json() == {"status": "no_nodes", "healthy_nodes": [],
                            "redis": "disabled"}
    gw.beat(heartbeat(node_url, "fra", status="starting"), FRA).raise_for_status()
    assert httpx.get(f"{gw.url}/health").status_code == 503
    gw.beat(heartbeat(node_url, "fra", status="degraded"), FRA).raise_for_status()
    assert httpx.get(f"{gw.url}/health").json() == {"status": "degraded",
                                                     "healthy_nodes": ["fra"],
                                                     "redis": "disabled"}
    gw.beat(heartbeat(node_url, "fra"), FRA).raise_for_status()
    ok = httpx.get(f"{gw.url}/health")
    assert ok.status_code == 200 and ok.json()["status"] == "ok"


def test_an_authenticated_gateway_is_not_bypassed_through_the_rest_route(secured):
    gw, _, node_url = secured
    gw.beat(heartbeat(node_url, "fra"), FRA).raise_for_status()
    with gw.client() as client:
        client.post(f"/client/v4/accounts/{gw.account_id}/ai-gateway/gateways",
                    json={"id": "locked", "authentication": True}).raise_for_status()
        url, body = RUN.format(gw.account_id), {"prompt": "hi"}
        bypass = client.post(url, json=body, headers={"cf-aig-gateway-id": "locked"})
        assert bypass.status_code == 401 and _error(bypass)["code"] == 10000
        allowed = client.post(url, json=body, headers={
            "cf-aig-gateway-id": "locked", "cf-aig-authorization": f"Bearer {gw.token}"})
        assert allowed.status_code == 200, allowed.text


def test_session_pins_belong_to_one_account(serve, tmp_path):
    fra, sin = RecordingUpstream(), RecordingUpstream()
    with serve(fra) as fra_url, serve(sin) as sin_url, \
            gateway(serve, tmp_path, node_secret=FLEET) as gw:
        gw.beat(heartbeat(fra_url, "fra"), FLEET).raise_for_status()
        gw.beat(heartbeat(sin_url, "sin"), FLEET).raise_for_status()
        other_id = gw.state.accounts.create_account("b").id
        _, other_token = gw.state.accounts.create_token(other_id)
        session = {"x-session-affinity": "same-id"}
        with gw.client() as a:  # a pins the session to Singapore, from Singapore
            a.post(RUN.format(gw.account_id), json={"prompt": "hi"},
                   headers={**session, "cf-ipcountry": "SG"}).raise_for_status()
        assert len(sin.seen) == 1
        # b, in Germany, sends the same session id: it goes to its nearest node, not a's.
        httpx.post(f"{gw.url}{RUN.format(other_id)}", json={"prompt": "hi"},
                   headers={**session, "cf-ipcountry": "DE",
                            "authorization": f"Bearer {other_token}"}).raise_for_status()
        assert (len(fra.seen), len(sin.seen)) == (1, 1)


def test_a_planning_only_model_is_refused_before_any_node_is_asked(secured):
    gw, node, node_url = secured
    gw.beat(heartbeat(node_url, "fra"), FRA).raise_for_status()
    with gw.client() as client:
        response = client.post(f"{gw.url}/client/v4/accounts/{gw.account_id}/ai/run/"
                               "@cf/meta/llama-3.1-8b-instruct", json={"prompt": "hi"})
    assert response.status_code == 400 and _error(response)["code"] == 5018, response.text
    assert not node.seen
