"""The fleet as an account may see it: every city, its health and load, the models it has
loaded and which catalog models it may host. Node URLs and credentials stay out (those are
the operator's, at /internal/nodes).

A city is listed from its YAML even while no node reports for it ("offline"); a node of a city
without a YAML (an operator's own) is listed from its heartbeat alone.
"""

from __future__ import annotations

from dataclasses import asdict

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.cities import City
from edgefire.gateway.routing.directory import NodeDirectory, NodeState


def fleet_view(directory: NodeDirectory, cities: list[City], catalog: Catalog) -> dict:
    nodes = {node.city: node for node in directory.nodes()}
    healthy = {node.city for node in directory.healthy()}
    declared = {city.code: city for city in cities}
    rows = []
    for code in sorted(declared.keys() | nodes.keys()):
        city, node = declared.get(code), nodes.get(code)
        rows.append(_row(code, city, node, directory, code in healthy, catalog.specs))
    return {"heartbeat_timeout_s": directory.heartbeat_timeout_s, "cities": rows}


def _row(code: str, city: City | None, node: NodeState | None, directory: NodeDirectory,
         healthy: bool, specs: list[ModelSpec]) -> dict:
    live = node is not None and directory.is_live(node)
    budget = node.memory_budget_bytes if node else city.memory_budget_bytes if city else 0
    loaded = node.loaded_models if live else {}
    row = {
        "code": code,
        "name": city.name if city else node.name,
        "country": city.country if city else "",
        "lat": city.lat if city else node.lat,
        "lon": city.lon if city else node.lon,
        "role": node.role if node else city.role,
        "accelerators": asdict(city.accelerators) if city else None,
        "memory_budget_bytes": budget,
        "status": _status(node, live, healthy),
        "healthy": healthy,
        "running": node.running if live else 0,
        "waiting": node.waiting if live else 0,
        "kv_usage": node.kv_usage if live else 0.0,
        "heartbeat_age_s": round(directory.age_s(node), 3) if node else None,
        "loaded_models": [{"id": model_id, **info} for model_id, info in loaded.items()],
        "hosts": [_verdict(spec, loaded, budget) for spec in specs],
    }
    return row


def _status(node: NodeState | None, live: bool, healthy: bool) -> str:
    if not live:
        return "offline"
    if node.status == "starting":
        return "starting"
    # Routing skips a node that just refused a connection: degraded until it beats again.
    return node.status if healthy else "degraded"


def _verdict(spec: ModelSpec, loaded: dict, budget: int) -> dict:
    """Whether the city may host spec: loaded now, fits its memory budget, is too big for
    it, or cannot run on this machine at all (listed for planning only)."""
    if spec.id in loaded:
        verdict = "loaded"
    elif not spec.runnable or not spec.weights:
        verdict = "planning_only"
    else:
        verdict = "fits" if spec.need_bytes <= budget else "too_big"
    return {"model": spec.id, "verdict": verdict, "need_bytes": spec.need_bytes}
