"""The gateway's plugin world: the built-in providers, then the `edgefire.gateway` entry-point
group. Node plugins (architectures, codecs: torch) are another world and never load here."""

from __future__ import annotations

from edgefire.gateway.plugins import hookspecs
from edgefire.plugin_host import PluginHost, allow_list_from_env

ENTRY_POINT_GROUP = "edgefire.gateway"
DEFAULT_PLUGINS = ("edgefire.gateway.providers.builtin",)


class GatewayPluginHost(PluginHost):
    """The gateway's plugin manager and the provider registry its plugins fill."""

    def __init__(self, defaults: tuple[str, ...] = DEFAULT_PLUGINS) -> None:
        super().__init__((hookspecs,), defaults, ENTRY_POINT_GROUP)
        self.providers = self.add_registry("provider", "edgefire_register_providers")


_host = GatewayPluginHost()


def load_gateway_plugins() -> GatewayPluginHost:
    """The process-wide gateway plugin host, loaded on first call (EDGEFIRE_PLUGINS is read
    then)."""
    return _host.load(allow_list_from_env())
