"""One edge node: a city, its settings, the catalog and the models it holds."""

from __future__ import annotations

import logging
from dataclasses import replace

from edgefire.contract.catalog import Catalog
from edgefire.contract.cities import City
from edgefire.runtime.engine.compute_thread import ComputeThread
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.node.model_registry import ModelRegistry
from edgefire.runtime.node.served import ServedLM, build_served_model
from edgefire.runtime.node.settings import NodeSettings
from edgefire.runtime.plugins import load_plugins

log = logging.getLogger(__name__)


def with_layouts(catalog: Catalog, layouts: dict[str, dict[str, int]]) -> Catalog:
    """catalog with each named model's parallel layout set (a city's `parallel:`); an unknown
    model or a malformed layout fails the node's start, not its first request."""
    if not layouts:
        return catalog
    chosen = {}
    for name, raw in layouts.items():
        ParallelLayout.parse(raw, name)
        chosen[catalog.get(name).id] = raw
    return Catalog([replace(spec, extra={**spec.extra, "parallel": chosen[spec.id]})
                    if spec.id in chosen else spec for spec in catalog.specs])


class EdgeNode:
    def __init__(self, city: City, settings: NodeSettings | None = None,
                 catalog: Catalog | None = None) -> None:
        self.city = city
        self.settings = settings or NodeSettings()
        self.catalog = with_layouts(catalog or Catalog.load(self.settings.catalog),
                                    city.parallel)
        # All torch work of the node (loads, steps, embedding batches) runs on this one thread.
        self.compute = ComputeThread(f"edgefire-{city.code}")
        self.registry = ModelRegistry(
            self.catalog, city.memory_budget_bytes,
            lambda spec: build_served_model(spec, self.settings, self.compute), self.compute)
        self.ready = False

    @property
    def role(self) -> str:
        """prefill, decode or both: the settings' over the city's."""
        return self.settings.role or self.city.role

    def start(self) -> None:
        """Load plugins (models load lazily, on their first request); then the node is ready."""
        load_plugins()
        if not self.settings.node_secret:
            log.warning("EDGEFIRE_NODE_SECRET is not set: node %s accepts requests from anyone "
                        "(fine for local development)", self.city.code)
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        self.registry.close()
        self.compute.shutdown()

    def health(self) -> dict:
        """What GET /health shows; safe to call from any thread.

        `status` is "starting" until ready, then "degraded" while a model failed lately (its
        engine died, or a step failed and none has succeeded since; ids in
        `degraded_models`), else "ok". A degraded node still serves: its other models are
        fine and a dead engine is rebuilt by the next request for it. Models with a KV store
        behind their pool report its state under `kv_store`.
        """
        degraded = self.registry.degraded()
        status = "starting" if not self.ready else "degraded" if degraded else "ok"
        health = {
            "status": status,
            "city": self.city.code,
            "role": self.role,
            "loaded_models": self.registry.loaded(),
            "memory_budget_bytes": self.registry.budget_bytes,
            "memory_used_bytes": self.registry.used_bytes,
            "degraded_models": degraded,
        }
        # A KV store that does not answer costs only remote prefix hits: the node serves
        # from its own pool meanwhile, so it stays "ok" and says so here.
        stores = {model_id: {"backend": tier.store.name,
                             "state": "ok" if tier.available else "unreachable"}
                  for model_id, served in self.registry.models().items()
                  if isinstance(served, ServedLM) and (tier := served.engine.remote_tier)}
        if stores:
            health["kv_store"] = stores
        return health
