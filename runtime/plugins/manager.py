"""Plugin discovery and registration: built-ins, then the `edgefire` entry-point group.

Plugins are found and their register hooks called once per process (load_plugins is lazy and
idempotent, so every worker process may call it). After that the engine only reads the
registries: no pluggy call happens per step or per token.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from edgefire.runtime.plugins import hookspecs
from edgefire.runtime.plugins.markers import PROJECT
from edgefire.runtime.plugins.registry import Registration, Registry

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "edgefire"
DEFAULT_PLUGINS = tuple(f"edgefire.plugins.{name}" for name in (
    "llama", "bert", "local_paged", "identity_codec", "unweight", "quant", "providers"))


@dataclass(slots=True)
class PluginInfo:
    name: str
    source: str  # "built-in" or the distribution that ships it, "name==version"
    registrations: list[Registration] = field(default_factory=list)


def allow_list_from_env() -> set[str] | None:
    """EDGEFIRE_PLUGINS: unset loads every installed plugin; "" none; "a,b" only those."""
    raw = os.environ.get("EDGEFIRE_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


class PluginHost:
    """A plugin manager and the registries its plugins fill."""

    def __init__(self, defaults: tuple[str, ...] = DEFAULT_PLUGINS) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        for spec in hookspecs.ALL:
            self.pm.add_hookspecs(spec)
        self.defaults = defaults
        self.models = Registry("model architecture", "edgefire_register_models")
        self.kv_backends = Registry("KV backend", "edgefire_register_kv_backends")
        self.parallel_strategies = Registry("parallel strategy",
                                            "edgefire_register_parallel_strategies")
        self.codecs = Registry("codec", "edgefire_register_codecs")
        self.providers = Registry("provider", "edgefire_register_providers")
        self.exporters = Registry("bundle exporter", "edgefire_register_exporters")
        self.registries = {r.kind: r for r in (self.models, self.kv_backends,
                                               self.parallel_strategies, self.codecs,
                                               self.providers, self.exporters)}
        self.plugins: dict[str, PluginInfo] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def load(self, allow: set[str] | None = None) -> PluginHost:
        """Register the built-ins and the allowed entry points; later calls do nothing."""
        with self._lock:
            if self._loaded:
                return self
            for module_name in self.defaults:
                self.register(importlib.import_module(module_name), module_name, "built-in")
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                if allow is not None and ep.name not in allow:
                    continue
                try:
                    plugin = ep.load()
                except Exception:
                    log.exception("plugin %r failed to import and was skipped", ep.name)
                    continue
                source = f"{ep.dist.name}=={ep.dist.version}" if ep.dist else ep.value
                self.register(plugin, ep.name, source)
            self.pm.check_pending()
            self._loaded = True
            return self

    def register(self, plugin: object, name: str, source: str) -> None:
        """Register one plugin and everything it registers, or skip it (logged) if it fails."""
        if name in self.plugins:
            return
        self.pm.register(plugin, name=name)
        try:
            registrations = self._collect(plugin, name)
        except Exception:
            log.exception("plugin %r failed while registering and was skipped", name)
            self.pm.unregister(name=name)
            return
        for registration in registrations:
            self.registries[registration.kind].add(registration)
        self.plugins[name] = PluginInfo(name, source, registrations)

    def unregister(self, name: str) -> None:
        """Remove a plugin and everything it registered (tests use this to clean up)."""
        info = self.plugins.pop(name, None)
        if info is None:
            return
        for registration in info.registrations:
            self.registries[registration.kind].discard(registration)
        self.pm.unregister(name=name)

    def _collect(self, plugin: object, name: str) -> list[Registration]:
        # Each plugin's hooks are called on their own so that what it registers is attributed
        # to it, and a failure in one plugin leaves the others' registrations intact.
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        collected: list[Registration] = []
        for registry in self.registries.values():
            def register(item_name: str, factory, kind: str = registry.kind) -> None:
                collected.append(Registration(kind, item_name, factory, name))

            self.pm.subset_hook_caller(registry.hook, remove_plugins=others)(register=register)
        return collected


_host = PluginHost()


def load_plugins() -> PluginHost:
    """The process-wide plugin host, loaded on first call (EDGEFIRE_PLUGINS is read then)."""
    return _host.load(allow_list_from_env())
