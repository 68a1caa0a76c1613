from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_codecs(register):
    """Called once per process by load_plugins(): register(name, factory) for each weight codec."""
