"""Plugin discovery and registration for one world: its built-ins, then its entry-point group.

A world (the node's, the gateway's) subclasses PluginHost with its hookspecs, its built-in
modules, its entry-point group and its registries. Plugins are found and their register hooks
called once per process (a world's loader is lazy and idempotent, so every worker process may
call it). After that the world only reads the registries: no pluggy call happens per step or per
token.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Self

import pluggy

from edgefire.plugin_host.markers import PROJECT
from edgefire.plugin_host.registry import Registration, Registry

log = logging.getLogger(__name__)

# Before the two worlds, every plugin declared this one group; nothing loads from it any more.
LEGACY_GROUP = "edgefire"


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
    """A plugin manager for one world and the registries its plugins fill."""

    def __init__(self, hookspecs: Iterable[ModuleType], defaults: tuple[str, ...],
                 group: str) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        for spec in hookspecs:
            self.pm.add_hookspecs(spec)
        self.defaults = defaults  # built-in plugin modules, registered before any entry point
        self.group = group  # the entry-point group third-party plugins of this world declare
        self.registries: dict[str, Registry] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def add_registry(self, kind: str, hook: str) -> Registry:
        """A registry filled by `hook`; subclasses keep each as a typed attribute."""
        registry = Registry(kind, hook)
        self.registries[kind] = registry
        return registry

    def load(self, allow: set[str] | None = None) -> Self:
        """Register the built-ins and the allowed entry points; later calls do nothing."""
        with self._lock:
            if self._loaded:
                return self
            for module_name in self.defaults:
                self.register(importlib.import_module(module_name), module_name, "built-in")
            for ep in entry_points(group=self.group):
                if allow is not None and ep.name not in allow:
                    continue
                try:
                    plugin = ep.load()
                except Exception:
                    log.exception("plugin %r failed to import and was skipped", ep.name)
                    continue
                source = f"{ep.dist.name}=={ep.dist.version}" if ep.dist else ep.value
                self.register(plugin, ep.name, source)
            legacy = sorted(ep.name for ep in entry_points(group=LEGACY_GROUP))
            if legacy:
                log.warning("plugins %s are declared in the entry-point group %r, which is no "
                            "longer read: declare node plugins in 'edgefire.node' and gateway "
                            "providers in 'edgefire.gateway'", ", ".join(legacy), LEGACY_GROUP)
            self._loaded = True
            return self

    def register(self, plugin: object, name: str, source: str) -> None:
        """Register one plugin and everything it registers, or skip it (logged) if it fails."""
        if name in self.plugins:
            return
        self.pm.register(plugin, name=name)
        unknown = self._unknown_hooks(plugin)
        if unknown:
            # Most likely a plugin of the other world declared in this world's group: it is
            # refused here alone rather than failing every plugin's load (pluggy's
            # check_pending would raise for the whole manager).
            log.error("plugin %r implements %s, which entry-point group %r does not know, and "
                      "was skipped", name, ", ".join(unknown), self.group)
            self.pm.unregister(name=name)
            return
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

    def listing(self) -> list[str]:
        """Each plugin, where it came from and what it registered, for a CLI to print."""
        lines = []
        for info in self.plugins.values():
            lines.append(f"{info.name}  ({info.source})")
            lines += [f"    {r.kind}: {r.name}" for r in info.registrations]
        return lines

    def _unknown_hooks(self, plugin: object) -> list[str]:
        callers = self.pm.get_hookcallers(plugin) or []
        return sorted(caller.name for caller in callers if not caller.has_spec() and any(
            impl.plugin is plugin and not impl.optionalhook for impl in caller.get_hookimpls()))

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
