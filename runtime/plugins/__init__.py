"""The node's plugin system: pluggy hooks, entry-point discovery (`edgefire.node`), registries.

Node plugins import `hookimpl` from here. The machinery itself is shared with the gateway's
plugin world and lives in edgefire.plugin_host.
"""

from edgefire.contract.errors import UnknownComponentError
from edgefire.plugin_host import DuplicatePluginError, PluginInfo, Registry, hookimpl
from edgefire.runtime.plugins.manager import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    NodePluginHost,
    load_plugins,
)

__all__ = [
    "DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "DuplicatePluginError", "NodePluginHost", "PluginInfo",
    "Registry", "UnknownComponentError", "hookimpl", "load_plugins",
]
