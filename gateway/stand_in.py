"""Stand-in models: a text-generation request for a catalog model that no node can host is
answered by a small model that can run, so code written for a large model works offline.

"No node can host" means planning-only in the catalog, or runnable but larger than the memory
budget of every live node. The stand-in is gateway-wide (EDGEFIRE_STAND_IN_MODEL; SmolLM2 in
`edge-gateway dev`). The requested model stays the request's model for pricing, caching, rules
and logs; only what is sent to the node changes, and the answer says so (x-edgefire-stand-in).
"""

from __future__ import annotations

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.errors import ConfigError, ModelUnavailableError, UnknownModelError
from edgefire.gateway.routing.directory import NodeDirectory

DEV_STAND_IN = "@cf/huggingfacetb/smollm2-135m-instruct"
TEXT_GENERATION = "text-generation"
_HINT = "set EDGEFIRE_STAND_IN_MODEL to answer it with a stand-in model"


class StandIns:
    """Which model serves a request: the requested one when a node can host it, else the
    stand-in (text generation only), else a 5018 that says how to get one."""

    def __init__(self, catalog: Catalog, model: str | None) -> None:
        self.catalog = catalog
        self.spec = _checked(catalog, model) if model else None

    def serving(self, model_id: str, directory: NodeDirectory) -> tuple[ModelSpec, bool]:
        """The spec to send to a node for model_id, and whether it is the stand-in's.

        UnknownModelError (5007) for an unknown id; ModelUnavailableError (5018) for a model
        that cannot run here and is not stood in. A runnable model no node has room for, of a
        task that is never stood in, is returned as it is: routing answers 3040 as before.
        """
        spec = self.catalog.get(model_id)
        if _hostable(spec, directory):
            return spec, False
        if spec.task != TEXT_GENERATION:
            return self.catalog.get_runnable(model_id), False  # planning-only: 5018 as before
        if self.spec is not None:
            return self.spec, True
        if not spec.runnable or not spec.weights:
            raise ModelUnavailableError(
                f"{spec.id} is listed for planning only and cannot run on this machine; "
                f"{_HINT}", field="model")
        largest = max(node.memory_budget_bytes for node in directory.healthy()) >> 20
        raise ModelUnavailableError(
            f"{spec.id} needs {spec.need_bytes >> 20} MiB, more than any live node offers "
            f"(largest budget {largest} MiB); {_HINT}", field="model")


def _hostable(spec: ModelSpec, directory: NodeDirectory) -> bool:
    """Runnable, and some live node could hold it. With no live node at all nothing is known
    of budgets yet (the fleet is starting, or down): routing says so in its own words."""
    if not spec.runnable or not spec.weights:
        return False
    live = directory.healthy()
    return not live or any(node.can_hold(spec.id, spec.need_bytes) for node in live)


def _checked(catalog: Catalog, model: str) -> ModelSpec:
    """The stand-in's spec, refused at start-up unless it is a runnable text-generation model."""
    try:
        spec = catalog.get(model)
    except UnknownModelError:
        raise ConfigError(f"EDGEFIRE_STAND_IN_MODEL {model!r} is not in the catalog",
                          field="stand_in_model") from None
    if spec.task != TEXT_GENERATION or not spec.runnable or not spec.weights:
        raise ConfigError(f"EDGEFIRE_STAND_IN_MODEL {model!r} must be a runnable "
                          f"{TEXT_GENERATION} model", field="stand_in_model")
    return spec
