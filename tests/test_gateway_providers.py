"""openai-compatible upstreams over real HTTP: a client reaches only the allowed API paths
under base_url, whatever it writes in the provider URL or a universal step's endpoint."""

from __future__ import annotations

import httpx
import pytest

from edgefire.contract.errors import ConfigError
from edgefire.gateway.providers.base import ProviderContext
from edgefire.gateway.providers.openai_compatible import OpenAICompatibleProvider
from tests.gateway_fakes import RecordingUpstream, gateway

CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def upstream(serve, tmp_path):
    """A gateway with provider `up` at {fake}/base/v1 (default paths) and `narrow` (one
    configured path), the fake upstream, and an authenticated client."""
    fake = RecordingUpstream()
    with serve(fake) as fake_url:
        config = {"providers": {
            "up": {"type": "openai-compatible", "base_url": f"{fake_url}/base/v1",
                   "api_key": "sk-operator"},
            "narrow": {"type": "openai-compatible", "base_url": f"{fake_url}/base",
                       "api_key": "sk-operator", "allowed_paths": ["custom/run"]}}}
        with gateway(serve, tmp_path, config, node_secret="s") as gw, gw.client() as client:
            yield gw, fake, client


def test_an_allowed_path_reaches_the_upstream_with_the_operators_key(upstream):
    gw, fake, client = upstream
    answer = client.post(f"/v1/{gw.account_id}/default/up/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    assert (fake.seen[-1].path, fake.seen[-1].query) == ("/base/v1/chat/completions", "")
    assert fake.seen[-1].headers["authorization"] == "Bearer sk-operator"


@pytest.mark.parametrize("path", [
    "..%2F..%2Fadmin", "chat%2F..%2F..%2Fadmin", "%2E%2E/%2E%2E/admin", "chat/completions%3Fa=1",
    "chat/completions%23x", "files", "v1/files", "chat/completions%2520", "chat/%252E%252E/x",
])
def test_provider_url_paths_cannot_leave_the_allow_list(upstream, path):
    gw, fake, client = upstream
    refused = client.post(f"/v1/{gw.account_id}/default/up/{path}", json=CHAT)
    assert refused.status_code == 400, (path, refused.text)
    assert refused.json()["errors"][0]["code"] == 5006
    assert fake.seen == []


def test_an_escaped_slash_is_decoded_before_the_allow_list(upstream):
    gw, fake, client = upstream
    # The router decodes the URL path first, so this is chat/completions; what reaches the
    # upstream is rebuilt from the allowed path, never the client's spelling.
    assert client.post(f"/v1/{gw.account_id}/default/up/chat%2Fcompletions",
                       json=CHAT).status_code == 200
    assert fake.seen[-1].path == "/base/v1/chat/completions"


@pytest.mark.parametrize("endpoint", [
    "../../admin", "chat/completions/../../../admin", "./chat/completions", "chat//completions",
    "chat/completions?admin=1", "chat/completions#x", "chat\\..\\admin", "models", "",
])
def test_universal_step_endpoints_cannot_leave_the_allow_list(upstream, endpoint):
    gw, fake, client = upstream
    refused = client.post(f"/v1/{gw.account_id}/default",
                          json=[{"provider": "up", "endpoint": endpoint, "query": CHAT}])
    assert refused.status_code == 400, (endpoint, refused.text)
    assert refused.json()["errors"][0]["code"] == 5006
    assert fake.seen == []


def test_allowed_paths_are_configurable(upstream):
    gw, fake, client = upstream
    base = f"/v1/{gw.account_id}/default/narrow"
    assert client.post(f"{base}/custom/run", json=CHAT).status_code == 200
    assert fake.seen[-1].path == "/base/custom/run"
    assert client.post(f"{base}/chat/completions", json=CHAT).status_code == 400
    assert len(fake.seen) == 1


def test_allowed_paths_must_be_a_list():
    context = ProviderContext(None, httpx.AsyncClient(), None, None,  # type: ignore[arg-type]
                              {"base_url": "http://x", "allowed_paths": "chat/completions"})
    with pytest.raises(ConfigError, match="allowed_paths"):
        OpenAICompatibleProvider("up", context)


def test_a_provider_from_a_gateway_plugin_is_chosen_by_its_type(serve, tmp_path):
    # `dummy-echo` comes from the edgefire-dummy-plugin distribution's `edgefire.gateway`
    # entry point; it answers by itself, naming the provider and the path it was given.
    config = {"providers": {"echo": {"type": "dummy-echo"}}}
    with gateway(serve, tmp_path, config) as gw, gw.client() as client:
        answer = client.post(f"/v1/{gw.account_id}/default/echo/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"provider": "echo", "path": "chat/completions"}
