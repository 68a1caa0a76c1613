"""Typed name → factory registries that plugins fill at start-up and their world reads once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgefire.contract.errors import UnknownComponentError


class DuplicatePluginError(RuntimeError):
    """Two plugins registered the same name in one registry."""


@dataclass(slots=True, frozen=True)
class Registration:
    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str


class Registry:
    def __init__(self, kind: str, hook: str) -> None:
        self.kind = kind
        self.hook = hook  # the register hook that fills this registry
        self._entries: dict[str, Registration] = {}

    def add(self, registration: Registration) -> None:
        current = self._entries.get(registration.name)
        if current is not None and current.plugin != registration.plugin:
            raise DuplicatePluginError(
                f"{self.kind} {registration.name!r} is registered by both plugin "
                f"{current.plugin!r} and plugin {registration.plugin!r}")
        self._entries[registration.name] = registration  # the same plugin again: idempotent

    def discard(self, registration: Registration) -> None:
        if self._entries.get(registration.name) == registration:
            del self._entries[registration.name]

    def get(self, name: str) -> Callable[..., Any]:
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownComponentError(f"no {self.kind} named {name!r} (registered: {known})",
                                        field=self.kind)
        return entry.factory

    def names(self) -> list[str]:
        return sorted(self._entries)
