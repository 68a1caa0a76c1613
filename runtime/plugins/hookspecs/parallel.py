from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_parallel_strategies(register):
    """Called once per process by load_plugins(): register(name, factory) per parallel layout."""
