"""The README's "Writing a plugin" examples (a node plugin, a gateway plugin), run as written."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

import httpx
import pytest
import yaml

from edgefire.contract.catalog import Catalog
from edgefire.contract.errors import InvalidInputError
from edgefire.gateway.node_auth import NodeCredentials
from edgefire.gateway.plugins import GatewayPluginHost
from edgefire.gateway.providers.base import ProviderContext, UpstreamRequest
from edgefire.runtime.plugins import load_plugins

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(language: str) -> list[str]:
    text = README.read_text()
    section = text.split("## Writing a plugin", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"README.md:{name}.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def readme_plugin():
    plugin_source, _usage, _gateway_plugin = _blocks("python")
    module = _module("my_plugins", plugin_source)
    host = load_plugins()
    host.register(module, "my_plugins", "README")
    yield module
    host.unregister("my_plugins")


def test_readme_has_the_plugin_and_usage_blocks():
    blocks = _blocks("python")
    assert len(blocks) == 3
    assert "edgefire_register_codecs" in blocks[0] and "LLM(" in blocks[1]
    assert "edgefire_register_providers" in blocks[2]
    node_group, gateway_group = _blocks("toml")
    assert '[project.entry-points."edgefire.node"]' in node_group
    assert '[project.entry-points."edgefire.gateway"]' in gateway_group


def test_readme_codec_round_trips(readme_plugin):
    import torch

    codec = load_plugins().codecs.get("torch_save")()
    weight = torch.randn(4, 8, dtype=torch.bfloat16)
    assert torch.equal(codec.decode(codec.encode(weight)), weight)


@pytest.mark.slow
def test_readme_usage_runs(readme_plugin, capsys):
    _plugin, usage, _gateway_plugin = _blocks("python")
    scope: dict = {}
    exec(compile(usage, "README.md:usage", "exec"), scope)
    printed = capsys.readouterr().out.strip()
    token_ids = [int(t) for t in printed.strip("[]").split(",")]
    assert len(token_ids) == 4
    # The README's model predates deterministic mode (its forward takes no row_block): it
    # serves ordinary requests, and a deterministic one is refused, not run differently.
    params = scope["SamplingParams"](max_tokens=2, temperature=0, deterministic=True)
    with pytest.raises(InvalidInputError, match="cannot run deterministically"):
        scope["llm"].generate("Once upon a", params)


def test_readme_gateway_provider_takes_its_upstreams_in_turn():
    host = GatewayPluginHost(defaults=())
    host.register(_module("my_gateway_plugins", _blocks("python")[2]), "my_gateway_plugins",
                  "README")
    (settings,) = yaml.safe_load(_blocks("yaml")[0])["providers"].values()
    hosts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        hosts.append(f"{request.url.host}{request.url.path}")
        return httpx.Response(200, json={"ok": True})

    async def three_requests() -> list[int]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            context = ProviderContext(Catalog([]), http, None, NodeCredentials.load(None, {}),
                                      settings)
            provider = host.providers.get(settings["type"])("pool", context)
            request = UpstreamRequest("acct", "chat/completions", b"{}")
            return [(await provider.send(request)).status for _ in range(3)]

    assert asyncio.run(three_requests()) == [200, 200, 200]
    assert hosts == ["10.0.0.1/v1/chat/completions", "10.0.0.2/v1/chat/completions",
                     "10.0.0.1/v1/chat/completions"]
