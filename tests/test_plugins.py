"""Plugin discovery, allow-list, failure isolation, duplicates, and the engine's use of plugins."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest

from edgefire.contract.errors import UnknownComponentError
from edgefire.runtime.cli import main as cli_main
from edgefire.runtime.plugins import DuplicatePluginError, PluginHost, hookimpl
from edgefire.runtime.plugins import manager as plugin_manager
from edgefire.runtime.plugins.manager import allow_list_from_env

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


def test_builtins_and_installed_entry_point_are_discovered():
    host = PluginHost().load()
    builtins = {"edgefire.plugins.llama", "edgefire.plugins.local_paged",
                "edgefire.plugins.identity_codec"}
    assert builtins <= set(host.plugins)
    dummy = host.plugins["dummy"]
    assert dummy.source == "edgefire-dummy-plugin==0.1.0"
    assert {(r.kind, r.name) for r in dummy.registrations} == {
        ("KV backend", "dummy_counting"), ("codec", "dummy_zlib")}
    assert host.models.names() == ["bert", "llama"]
    assert "dummy_zlib" in host.codecs.names()


def test_allow_list_limits_entry_points_not_builtins():
    only_builtins = PluginHost().load(allow=set())
    assert "dummy" not in only_builtins.plugins
    assert "local_paged" in only_builtins.kv_backends.names()
    assert "dummy" in PluginHost().load(allow={"dummy"}).plugins


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
    monkeypatch.setattr(plugin_manager, "entry_points", lambda group: fakes)
    with caplog.at_level(logging.ERROR, logger="edgefire.runtime.plugins.manager"):
        host = PluginHost().load()
    assert "good" in host.plugins and "good_codec" in host.codecs.names()
    assert "broken_import" not in host.plugins and "broken_register" not in host.plugins
    assert "half_done" not in host.codecs.names()  # nothing of a failed plugin is kept
    logged = caplog.text
    assert "'broken_import' failed to import" in logged
    assert "'broken_register' failed while registering" in logged


def test_duplicate_names_are_rejected_naming_both_plugins():
    host = PluginHost(defaults=())
    host.register(_codec_plugin("same"), "first", "test")
    with pytest.raises(DuplicatePluginError, match="'first'.*'second'"):
        host.register(_codec_plugin("same"), "second", "test")


def test_loading_and_registering_are_idempotent():
    host = PluginHost().load()
    before = {kind: r.names() for kind, r in host.registries.items()}
    host.load()
    host.register(_codec_plugin("x"), "edgefire.plugins.llama", "again")  # a known name: ignored
    assert {kind: r.names() for kind, r in host.registries.items()} == before


def test_unknown_component_names_what_is_registered():
    host = PluginHost().load()
    with pytest.raises(UnknownComponentError, match="no KV backend named 'nope'.*local_paged"):
        host.kv_backends.get("nope")


def test_cli_lists_plugins_and_their_source(capsys):
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "dummy  (edgefire-dummy-plugin==0.1.0)" in out
    assert "codec: dummy_zlib" in out and "model architecture: llama" in out


@pytest.fixture(scope="module")
def reference_tokens():
    from edgefire.runtime import LLM, SamplingParams

    llm = LLM(MODEL, dtype="float32")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    return [r.token_ids for r in llm.generate(["Once upon a time", "The sea is"], params)]


@pytest.mark.slow
def test_third_party_codec_and_kv_backend_are_used_by_name(reference_tokens):
    import edgefire_dummy

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
