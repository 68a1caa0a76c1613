"""The node's plugin world: built-ins, then the `edgefire.node` entry-point group.

Architectures, KV backends, parallel strategies, weight codecs and bundle exporters. Gateway
providers are another world (edgefire.gateway.plugins), so a node never imports gateway code and
the gateway never loads these plugins (nor torch).
"""

from __future__ import annotations

from edgefire.plugin_host import PluginHost, allow_list_from_env
from edgefire.runtime.plugins import hookspecs

ENTRY_POINT_GROUP = "edgefire.node"
DEFAULT_PLUGINS = tuple(f"edgefire.plugins.{name}" for name in (
    "llama", "llama4", "deepseek_v3", "bert", "local_paged", "redis_kv", "kv_codecs",
    "identity_codec", "unweight", "quant", "tensor_parallel", "pipeline_parallel",
    "expert_parallel"))


class NodePluginHost(PluginHost):
    """The node's plugin manager and the registries its plugins fill."""

    def __init__(self, defaults: tuple[str, ...] = DEFAULT_PLUGINS) -> None:
        super().__init__(hookspecs.ALL, defaults, ENTRY_POINT_GROUP)
        self.models = self.add_registry("model architecture", "edgefire_register_models")
        self.kv_backends = self.add_registry("KV backend", "edgefire_register_kv_backends")
        self.kv_codecs = self.add_registry("KV codec", "edgefire_register_kv_codecs")
        self.parallel_strategies = self.add_registry(
            "parallel strategy", "edgefire_register_parallel_strategies")
        self.codecs = self.add_registry("codec", "edgefire_register_codecs")
        self.exporters = self.add_registry("bundle exporter", "edgefire_register_exporters")


_host = NodePluginHost()


def load_plugins() -> NodePluginHost:
    """The process-wide node plugin host, loaded on first call (EDGEFIRE_PLUGINS is read then)."""
    return _host.load(allow_list_from_env())
