from edgefire.plugin_host.markers import hookspec


@hookspec
def edgefire_register_exporters(register):
    """Called once per process by load_plugins(): register(architecture, export) where
    export(spec) returns the model's runtime-layout BF16 weights, tokenizer and config as a
    WarmEntry, the input of `edgefire compress`."""
