from edgefire.runtime.plugins.markers import hookspec


@hookspec
def edgefire_register_providers(register):
    """Called once per process by load_plugins(): register(name, factory) per gateway provider."""
