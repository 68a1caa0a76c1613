"""The plugin system: pluggy hooks, entry-point discovery, registries of factories."""

from edgefire.contract.errors import UnknownComponentError
from edgefire.runtime.plugins.manager import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginHost,
    PluginInfo,
    load_plugins,
)
from edgefire.runtime.plugins.markers import hookimpl
from edgefire.runtime.plugins.registry import DuplicatePluginError, Registry

__all__ = [
    "DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "DuplicatePluginError", "PluginHost", "PluginInfo",
    "Registry", "UnknownComponentError", "hookimpl", "load_plugins",
]
