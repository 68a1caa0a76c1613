"""The gateway's plugin system: providers from the built-ins and the `edgefire.gateway`
entry-point group. Gateway plugins import `hookimpl` from here."""

from edgefire.gateway.plugins.host import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    GatewayPluginHost,
    load_gateway_plugins,
)
from edgefire.plugin_host import hookimpl

__all__ = ["DEFAULT_PLUGINS", "ENTRY_POINT_GROUP", "GatewayPluginHost", "hookimpl",
           "load_gateway_plugins"]
