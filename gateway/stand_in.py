"""Stand-in models: a text-generation request for a catalog model that no node can host is
answered by a small model that can run, so code written for a large model works offline.

"No node can host" means planning-only in the catalog, runnable but refused by the capacity
planner on every live node's declared accelerators (edgefire.gateway.routing.placement), or
larger than the memory budget of every live node. The stand-in is gateway-wide
(EDGEFIRE_STAND_IN_MODEL; SmolLM2 in `edge-gateway dev`). The requested model stays the
request's model for pricing, caching, rules and logs; only what is sent to the node changes,
and the answer says so (x-edgefire-stand-in).
"""

from __future__ import annotations

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.errors import ConfigError, ModelUnavailableError, UnknownModelError
from edgefire.gateway.routing.directory import NodeDirectory
from edgefire.gateway.routing.placement import Placement

DEV_STAND_IN = "@cf/huggingfacetb/smollm2-135m-instruct"
TEXT_GENERATION = "text-generation"
_HINT = "set EDGEFIRE_STAND_IN_MODEL to answer it with a stand-in model"


class StandIns:
    """Which model serves a request: the requested one when a node can host it, else the
    stand-in (text generation only), else a 5018 that says how to get one."""

    def __init__(self, catalog: Catalog, model: str | None,
                 placement: Placement | None = None) -> None:
        self.catalog = catalog
        self.spec = _checked(catalog, model) if model else None
        self.placement = placement or Placement()

    def serving(self, model_id: str, directory: NodeDirectory) -> tuple[ModelSpec, bool]:
        """The spec to send to a node for model_id, and whether it is the stand-in's.

        UnknownModelError (5007) for an unknown id; ModelUnavailableError (5018) for a model
        that cannot run here and is not stood in: NoHostError (5018) when the planner refuses
        it on every live city's accelerators, whatever its task. A runnable model no node has
        room for, of a task that is never stood in, is returned as it is: routing answers
        3040 as before.
        """
        spec = self.catalog.get(model_id)
        need = spec.need_bytes
        if self._hostable(spec, directory, need):
            return spec, False
        runnable = spec.runnable and bool(spec.weights)
        text = spec.task == TEXT_GENERATION
        refusal = self.placement.refusal(spec, directory, f"; {_HINT}" if text else "") \
            if runnable else None
        if not text:
            if refusal is not None:
                raise refusal
            return self.catalog.get_runnable(model_id), False  # planning-only: 5018 as before
        if self.spec is not None:
            return self.spec, True
        if not runnable:
            raise ModelUnavailableError(
                f"{spec.id} is listed for planning only and cannot run on this machine; "
                f"{_HINT}", field="model")
        if refusal is not None:
            raise refusal
        largest = max(node.memory_budget_bytes for node in directory.healthy()) >> 20
        raise ModelUnavailableError(
            f"{spec.id} needs {need >> 20} MiB, more than any live node offers "
            f"(largest budget {largest} MiB); {_HINT}", field="model")

    def _hostable(self, spec: ModelSpec, directory: NodeDirectory, need: int) -> bool:
        """Runnable, and some live node may host it (placement) and could hold it (budget).
        With no live node at all nothing is known of budgets yet (the fleet is starting, or
        down): routing says so in its own words."""
        if not spec.runnable or not spec.weights:
            return False
        live = directory.healthy()
        return not live or any(node.can_hold(spec.id, need) and
                               self.placement.may_host(spec, node) for node in live)


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
