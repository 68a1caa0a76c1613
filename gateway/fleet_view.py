"""The fleet as an account may see it: every city, its health and load, the models it has
loaded and which catalog models it may host. Node URLs and credentials stay out (those are
the operator's, at /internal/nodes).

A city is listed from its YAML even while no node reports for it ("offline"); a node of a city
without a YAML (an operator's own) is listed from its heartbeat alone.

Hosting verdicts are placement's (edgefire.gateway.routing.placement), the rule routing uses:
the capacity planner on the city's declared accelerators and the real model, then the node's
memory budget for what runs here. Each verdict carries the planner's figures under `planner`.
"""

from __future__ import annotations

import contextlib

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.cities import City
from edgefire.contract.errors import PlanningError
from edgefire.gateway.routing.directory import NodeDirectory, NodeState
from edgefire.gateway.routing.placement import Placement, Verdict
from edgefire.planning import GIB
from edgefire.planning.accelerators import accelerator


def fleet_view(directory: NodeDirectory, cities: list[City], catalog: Catalog,
               placement: Placement | None = None) -> dict:
    placement = placement or Placement()
    # A disaggregated city runs a prefill and a decode node: its row is the node that takes
    # its requests (the decode node), so prefill nodes go first and are written over.
    ordered = sorted(directory.nodes(), key=lambda node: node.role != "prefill")
    nodes = {node.city: node for node in ordered}
    healthy = {node.city for node in directory.healthy() if nodes[node.city] is node}
    declared = {city.code: city for city in cities}
    hosts = _Hosts(catalog.specs, {spec.id: spec.need_bytes for spec in catalog.specs},
                   placement)
    rows = []
    for code in sorted(declared.keys() | nodes.keys()):
        city, node = declared.get(code), nodes.get(code)
        rows.append(_row(code, city, node, directory, code in healthy, hosts))
    return {"heartbeat_timeout_s": directory.heartbeat_timeout_s, "cities": rows}


def _row(code: str, city: City | None, node: NodeState | None, directory: NodeDirectory,
         healthy: bool, hosts: _Hosts) -> dict:
    live = node is not None and directory.is_live(node)
    budget = node.memory_budget_bytes if node else city.memory_budget_bytes if city else 0
    loaded = node.loaded_models if live else {}
    # The node's own declaration when it reports one, else its city's YAML.
    accelerators = (node.accelerators if node and node.accelerators else
                    {"kind": city.accelerators.kind, "count": city.accelerators.count}
                    if city else None)
    row = {
        "code": code,
        "name": city.name if city else node.name,
        "country": city.country if city else "",
        "lat": city.lat if city else node.lat,
        "lon": city.lon if city else node.lon,
        "role": node.role if node else city.role,
        "accelerators": _accelerators(accelerators),
        "memory_budget_bytes": budget,
        "status": _status(node, live, healthy),
        "healthy": healthy,
        "running": node.running if live else 0,
        "waiting": node.waiting if live else 0,
        "kv_usage": node.kv_usage if live else 0.0,
        "heartbeat_age_s": round(directory.age_s(node), 3) if node else None,
        "loaded_models": [{"id": model_id, **info} for model_id, info in loaded.items()],
        "hosts": hosts.verdicts(loaded, budget, accelerators),
    }
    return row


def _accelerators(declared: dict | None) -> dict | None:
    """The declaration, with one device's memory in GiB when the planner knows the kind."""
    if declared is None:
        return None
    city_form = {"kind": declared["kind"], "count": declared["count"], "memory_gib": None}
    # A kind this planner does not know has no figure; the rest stands.
    with contextlib.suppress(PlanningError):
        city_form["memory_gib"] = round(accelerator(declared["kind"]).memory_bytes / GIB, 1)
    return city_form


def _status(node: NodeState | None, live: bool, healthy: bool) -> str:
    if not live:
        return "offline"
    if node.status == "starting":
        return "starting"
    # Routing skips a node that just refused a connection: degraded until it beats again.
    return node.status if healthy else "degraded"


class _Hosts:
    def __init__(self, specs: list[ModelSpec], needs: dict[str, int],
                 placement: Placement) -> None:
        self.specs, self.needs, self.placement = specs, needs, placement

    def verdicts(self, loaded: dict, budget: int, accelerators: dict | None) -> list[dict]:
        return [self._verdict(spec, loaded, budget, accelerators) for spec in self.specs]

    def _verdict(self, spec: ModelSpec, loaded: dict, budget: int,
                 accelerators: dict | None) -> dict:
        """Whether the city may host spec: loaded now; fits (the planner places the real
        model on its accelerators and its memory budget holds what runs here); too big (one
        of the two says no); or cannot run on this machine at all (listed for planning
        only, though `planner` still says whether the site's GPUs could host it)."""
        need = self.needs[spec.id]
        planned = self.placement.verdict(spec, accelerators)
        if spec.id in loaded:
            verdict = "loaded"
        elif not spec.runnable or not spec.weights:
            verdict = "planning_only"
        else:
            placed = planned is None or planned.may_host
            verdict = "fits" if placed and need <= budget else "too_big"
        return {"model": spec.id, "verdict": verdict, "need_bytes": need,
                "planner": _planner(planned)}


def _planner(verdict: Verdict | None) -> dict | None:
    """The planner's figures for the real model on the site's GPUs (None: nothing planned)."""
    if verdict is None:
        return None
    p = verdict.plan
    return {"gpus": verdict.gpus, "may_host": verdict.may_host, "reason": verdict.reason,
            "layout": str(p.layout) if p else None,
            "weight_bytes_per_device": p.weight_bytes_per_device if p else None,
            "kv_bytes": p.kv_bytes if p else None, "kv_tokens": p.tokens if p else None}
