from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_kv_backends(register):
    """Called once per process by load_plugins(): register(name, factory) for each KV backend."""
