"""Plugin discovery, allow-list, failure isolation, duplicates, the two plugin worlds (node and
gateway) kept apart, and the engine's use of plugins."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import types

import pytest

from edgefire.contract.errors import UnknownComponentError
from edgefire.gateway.cli import main as gateway_cli_main
from edgefire.gateway.plugins import GatewayPluginHost
from edgefire.plugin_host import allow_list_from_env
from edgefire.plugin_host import host as plugin_host
from edgefire.runtime.cli import main as cli_main
from edgefire.runtime.plugins import DuplicatePluginError, NodePluginHost, hookimpl

MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"


class _FakeEntryPoint:
    def __init__(self, name: str, target: object = None, error: Exception | None = None):
        self.name, self.value, self.dist = name, f"fake:{name}", None
        self._target, self._error = target, error

    def load(self) -> object:
        if self._error is not None:
            raise self._error
        return self._target


def _plugin(**hooks) -> types.ModuleType:
    module = types.ModuleType("fake_plugin")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def _codec_plugin(codec_name: str) -> types.ModuleType:
    def edgefire_register_codecs(register):
        register(codec_name, object)

    return _plugin(edgefire_register_codecs=edgefire_register_codecs)


def _provider_plugin(provider_name: str) -> types.ModuleType:
    def edgefire_register_providers(register):
        register(provider_name, object)

    return _plugin(edgefire_register_providers=edgefire_register_providers)


def _entry_points_by_group(monkeypatch, groups: dict[str, list[_FakeEntryPoint]]) -> None:
    monkeypatch.setattr(plugin_host, "entry_points", lambda group: groups.get(group, []))


def test_builtins_and_installed_entry_point_are_discovered():
    host = NodePluginHost().load()
    builtins = {"edgefire.plugins.llama", "edgefire.plugins.local_paged",
                "edgefire.plugins.identity_codec"}
    assert builtins <= set(host.plugins)
    dummy = host.plugins["dummy"]
    assert dummy.source == "edgefire-dummy-plugin==0.1.0"
    assert {(r.kind, r.name) for r in dummy.registrations} == {
        ("KV backend", "dummy_counting"), ("codec", "dummy_zlib")}
    assert host.models.names() == ["bert", "deepseek_v3", "llama", "llama4_moe"]
    assert "dummy_zlib" in host.codecs.names()
    assert "dummy_provider" not in host.plugins  # the distribution's gateway entry point


def test_gateway_host_registers_builtin_and_entry_point_providers():
    host = GatewayPluginHost().load()
    assert set(host.plugins) == {"edgefire.gateway.providers.builtin", "dummy_provider"}
    assert host.plugins["dummy_provider"].source == "edgefire-dummy-plugin==0.1.0"
    assert host.providers.names() == ["dummy-echo", "openai-compatible", "workers-ai"]
    assert list(host.registries) == ["provider"]


def _fresh_process(code: str, plugins_env: str | None) -> dict:
    """Runs code (which prints JSON) in a new interpreter, where nothing is imported yet."""
    env = {k: v for k, v in os.environ.items() if k != "EDGEFIRE_PLUGINS"}
    if plugins_env is not None:
        env["EDGEFIRE_PLUGINS"] = plugins_env
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


_GATEWAY_WORLD = """
import json, sys
from edgefire.gateway.plugins import load_gateway_plugins
host = load_gateway_plugins()
print(json.dumps({"plugins": sorted(host.plugins), "providers": host.providers.names(),
                  "node": sorted(m for m in sys.modules if m == "torch" or m.startswith(
                      ("edgefire.runtime", "edgefire.plugins", "edgefire.models",
                       "edgefire_dummy.node")))}))
"""


@pytest.mark.parametrize(("plugins_env", "entry_points"), [
    (None, ["dummy_provider"]),
    ("", []),
    ("dummy", []),  # the node entry point's name allows nothing here
    ("dummy_provider", ["dummy_provider"]),
])
def test_the_gateway_world_loads_no_node_plugin_nor_torch(plugins_env, entry_points):
    seen = _fresh_process(_GATEWAY_WORLD, plugins_env)
    assert seen["plugins"] == sorted(["edgefire.gateway.providers.builtin", *entry_points])
    assert {"workers-ai", "openai-compatible"} <= set(seen["providers"])
    assert ("dummy-echo" in seen["providers"]) == bool(entry_points)
    assert seen["node"] == []


def test_node_world_has_no_providers_and_never_imports_the_gateway():
    seen = _fresh_process("""
import json, sys
from edgefire.runtime.plugins import load_plugins
host = load_plugins()
print(json.dumps({"plugins": sorted(host.plugins), "kinds": sorted(host.registries),
                  "providers": hasattr(host, "providers"),
                  "gateway": sorted(m for m in sys.modules if m.startswith(
                      ("edgefire.gateway", "edgefire_dummy.gateway")))}))
""", None)
    assert "dummy" in seen["plugins"] and "dummy_provider" not in seen["plugins"]
    assert "provider" not in seen["kinds"] and not seen["providers"]
    assert seen["gateway"] == []


def test_a_plugin_in_the_other_worlds_group_is_skipped_there(monkeypatch, caplog):
    _entry_points_by_group(monkeypatch, {
        "edgefire.node": [_FakeEntryPoint("misplaced_provider", _provider_plugin("far")),
                          _FakeEntryPoint("node_codec", _codec_plugin("near_codec"))],
        "edgefire.gateway": [_FakeEntryPoint("misplaced_codec", _codec_plugin("far_codec")),
                             _FakeEntryPoint("gateway_provider", _provider_plugin("near"))],
    })
    with caplog.at_level(logging.ERROR, logger="edgefire.plugin_host.host"):
        node = NodePluginHost(defaults=()).load()
        gateway = GatewayPluginHost(defaults=()).load()
    assert set(node.plugins) == {"node_codec"} and node.codecs.names() == ["near_codec"]
    assert set(gateway.plugins) == {"gateway_provider"} and gateway.providers.names() == ["near"]
    assert ("'misplaced_provider' implements edgefire_register_providers, which entry-point "
            "group 'edgefire.node' does not know") in caplog.text
    assert ("'misplaced_codec' implements edgefire_register_codecs, which entry-point group "
            "'edgefire.gateway' does not know") in caplog.text


def test_plugins_left_in_the_old_group_are_named_in_a_warning(monkeypatch, caplog):
    _entry_points_by_group(monkeypatch, {
        "edgefire": [_FakeEntryPoint("old_codec", _codec_plugin("old"))]})
    with caplog.at_level(logging.WARNING, logger="edgefire.plugin_host.host"):
        node = NodePluginHost(defaults=()).load()
    assert node.plugins == {}
    assert "plugins old_codec are declared in the entry-point group 'edgefire'" in caplog.text


def test_allow_list_limits_entry_points_not_builtins():
    only_builtins = NodePluginHost().load(allow=set())
    assert "dummy" not in only_builtins.plugins
    assert "local_paged" in only_builtins.kv_backends.names()
    assert "dummy" in NodePluginHost().load(allow={"dummy"}).plugins
    assert GatewayPluginHost().load(allow=set()).providers.names() == [
        "openai-compatible", "workers-ai"]
    assert "dummy_provider" in GatewayPluginHost().load(allow={"dummy_provider"}).plugins


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("", set()), ("a, b", {"a", "b"})])
def test_allow_list_from_env(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("EDGEFIRE_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("EDGEFIRE_PLUGINS", raw)
    assert allow_list_from_env() == expected


def test_failing_plugins_are_logged_and_skipped(monkeypatch, caplog):
    def edgefire_register_codecs(register):
        register("half_done", object)
        raise RuntimeError("boom")

    fakes = [
        _FakeEntryPoint("broken_import", error=ImportError("no module named nowhere")),
        _FakeEntryPoint("broken_register",
                        _plugin(edgefire_register_codecs=edgefire_register_codecs)),
        _FakeEntryPoint("good", _codec_plugin("good_codec")),
    ]
    _entry_points_by_group(monkeypatch, {"edgefire.node": fakes})
    with caplog.at_level(logging.ERROR, logger="edgefire.plugin_host.host"):
        host = NodePluginHost().load()
    assert "good" in host.plugins and "good_codec" in host.codecs.names()
    assert "broken_import" not in host.plugins and "broken_register" not in host.plugins
    assert "half_done" not in host.codecs.names()  # nothing of a failed plugin is kept
    logged = caplog.text
    assert "'broken_import' failed to import" in logged
    assert "'broken_register' failed while registering" in logged


def test_duplicate_names_are_rejected_naming_both_plugins():
    host = NodePluginHost(defaults=())
    host.register(_codec_plugin("same"), "first", "test")
    with pytest.raises(DuplicatePluginError, match="'first'.*'second'"):
        host.register(_codec_plugin("same"), "second", "test")


def test_loading_and_registering_are_idempotent():
    host = NodePluginHost().load()
    before = {kind: r.names() for kind, r in host.registries.items()}
    host.load()
    host.register(_codec_plugin("x"), "edgefire.plugins.llama", "again")  # a known name: ignored
    assert {kind: r.names() for kind, r in host.registries.items()} == before


def test_unknown_component_names_what_is_registered():
    host = NodePluginHost().load()
    with pytest.raises(UnknownComponentError, match="no KV backend named 'nope'.*local_paged"):
        host.kv_backends.get("nope")


def test_cli_lists_plugins_and_their_source(capsys):
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "dummy  (edgefire-dummy-plugin==0.1.0)" in out
    assert "codec: dummy_zlib" in out and "model architecture: llama" in out
    assert "provider" not in out


def test_gateway_cli_lists_its_plugins(capsys):
    assert gateway_cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "dummy_provider  (edgefire-dummy-plugin==0.1.0)" in out
    assert "provider: dummy-echo" in out and "provider: workers-ai" in out
    assert "codec" not in out


@pytest.fixture(scope="module")
def reference_tokens():
    from edgefire.runtime import LLM, SamplingParams

    llm = LLM(MODEL, dtype="float32")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    return [r.token_ids for r in llm.generate(["Once upon a time", "The sea is"], params)]


@pytest.mark.slow
def test_third_party_codec_and_kv_backend_are_used_by_name(reference_tokens):
    from edgefire_dummy import node as edgefire_dummy

    from edgefire.contract.catalog import Catalog
    from edgefire.runtime import LLM, EngineConfig, SamplingParams
    from edgefire.runtime.plugins import load_plugins

    spec = dataclasses.replace(Catalog.load().get(MODEL), codec="dummy_zlib")
    before = dict(edgefire_dummy.calls)
    llm = LLM(MODEL, catalog=Catalog([spec]),
              engine_config=EngineConfig(dtype="float32", kv_backend="dummy_counting"))
    monitored = []
    undo = load_plugins().pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: monitored.append(name), lambda *args: None)
    try:
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        tokens = [r.token_ids for r in llm.generate(["Once upon a time", "The sea is"], params)]
    finally:
        undo()
    assert tokens == reference_tokens
    calls = edgefire_dummy.calls
    assert calls["encode"] > before["encode"] and calls["decode"] > before["decode"]
    assert calls["allocate"] > before["allocate"]
    assert monitored == []  # no pluggy hook runs during generation
