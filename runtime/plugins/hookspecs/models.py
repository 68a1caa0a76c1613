from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_models(register):
    """Called once per process by load_plugins(): register(name, loader) for each architecture."""
