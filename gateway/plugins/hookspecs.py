"""The gateway's hook specification: providers are its only extension point."""

from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_providers(register):
    """Called once per process by load_gateway_plugins(): register(name, factory) per provider,
    where factory(name, ProviderContext) returns a Provider."""
