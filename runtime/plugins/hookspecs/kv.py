from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_kv_backends(register):
    """Called once per process by load_plugins(): register(name, factory) for each KV backend."""


@hookspec
def edgefire_register_kv_codecs(register):
    """Called once per process by load_plugins(): register(name, factory) for each KV page
    codec (how a page's bytes are stored in a KV store; runtime/engine/remote_kv/codec.py)."""
