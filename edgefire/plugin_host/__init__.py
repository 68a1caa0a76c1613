"""Plugin machinery shared by the two plugin worlds: pluggy markers, registries, a host.

The node's world (`edgefire.runtime.plugins`, entry-point group `edgefire.node`) and the
gateway's (`edgefire.gateway.plugins`, group `edgefire.gateway`) each build their host from this
package, which needs pluggy alone, so neither world imports the other (nor torch) to load.
"""

from edgefire.plugin_host.host import PluginHost, PluginInfo, allow_list_from_env
from edgefire.plugin_host.markers import PROJECT, hookimpl, hookspec
from edgefire.plugin_host.registry import DuplicatePluginError, Registration, Registry

__all__ = ["PROJECT", "DuplicatePluginError", "PluginHost", "PluginInfo", "Registration",
           "Registry", "allow_list_from_env", "hookimpl", "hookspec"]
