"""Placement: which nodes may host which model, as the capacity planner says.

A node may host a model when the planner's best plan of the model's REAL config (catalog
`config:`, the catalog's codec) fits the accelerators the node declares in its heartbeat, and
the node's memory budget holds what runs here (ModelSpec.need_bytes: the miniature, if any).
The heartbeat carries the declaration, rather than the gateway reading city YAMLs, because the
node is the authority on its hardware: a node of a city the gateway has no YAML for (an
operator's own) is placed like any other. A node that declares nothing, or a model without a
config, is placed by memory budget alone, as before placement existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.cities import City, all_cities
from edgefire.contract.errors import HostsOfflineError, NoHostError, PlanningError
from edgefire.gateway.routing.directory import NodeDirectory, NodeState
from edgefire.planning import GpuSet, Plan, PlannedModel, hosting, plan

MAX_CACHED = 4096  # (model, kind, count) verdicts; heartbeats name kinds, so it is bounded


@dataclass(slots=True, frozen=True)
class Verdict:
    may_host: bool
    gpus: str  # "8×H100", or the declaration as sent when the planner does not know it
    reason: str  # why not, "" when it may
    plan: Plan | None = None


class Placement:
    def __init__(self, cities: list[City] | None = None) -> None:
        """cities: the fleet's declared cities (edge_nodes/*.yaml by default), which an error
        names when the only ones that could host a model are not live."""
        self._verdicts: dict[tuple[str, str, int], Verdict | None] = {}
        self._hosting: dict[str, str] = {}
        self._declared = {c.code: {"kind": c.accelerators.kind, "count": c.accelerators.count}
                          for c in (all_cities() if cities is None else cities)}

    def verdict(self, spec: ModelSpec, accelerators: Mapping | None) -> Verdict | None:
        """The planner's verdict for spec's real model on the declared accelerators; None when
        there is nothing to plan (no declaration, or a model without a config)."""
        if not accelerators or not isinstance(spec.extra.get("config"), Mapping):
            return None
        kind, count = str(accelerators.get("kind")), int(accelerators.get("count", 0))
        key = (spec.id, kind, count)
        if key not in self._verdicts:
            if len(self._verdicts) >= MAX_CACHED:
                self._verdicts.clear()
            self._verdicts[key] = _plan(spec, kind, count)
        return self._verdicts[key]

    def may_host(self, spec: ModelSpec, node: NodeState) -> bool:
        verdict = self.verdict(spec, node.accelerators)
        return verdict is None or verdict.may_host

    def refusal(self, spec: ModelSpec, directory: NodeDirectory,
                hint: str = "") -> NoHostError | None:
        """Why no live node may host spec, when the planner is the reason (every live node
        refuses it on its accelerators); None when some live node's accelerators may (its
        memory budget is the reason then, or nothing is live)."""
        live = directory.healthy()
        verdicts = [(node, self.verdict(spec, node.accelerators)) for node in live]
        if not live or any(v is None or v.may_host for _, v in verdicts):
            return None
        by_set: dict[str, tuple[list[str], str]] = {}
        for node, v in verdicts:
            by_set.setdefault(v.gpus, ([], v.reason))[0].append(node.city)
        why = "; ".join(f"{gpus} ({', '.join(cities)}): {reason}"
                        for gpus, (cities, reason) in sorted(by_set.items()))
        # Cities not live now: heard from before (their last declaration) or declared in YAML.
        known = self._declared | {n.city: n.accelerators for n in directory.nodes()}
        live_cities = {node.city for node in live}
        offline = sorted(code for code, declared in known.items() if code not in live_cities
                         and (v := self.verdict(spec, declared)) is not None and v.may_host)
        fits = self._sets_that_host(spec)
        if offline:
            return HostsOfflineError(
                f"{spec.id} can be hosted only by {', '.join(offline)}, offline now; no live "
                f"city's accelerators can host it ({why}); it needs {fits}{hint}",
                field="model")
        return NoHostError(
            f"{spec.id} cannot be hosted by any city of the fleet: the capacity planner says "
            f"{why}; it needs {fits}{hint}", field="model")

    def _sets_that_host(self, spec: ModelSpec) -> str:
        text = self._hosting.get(spec.id)
        if text is None:
            found = [str(p.gpus) for p in hosting(PlannedModel.real(spec))]
            text = self._hosting[spec.id] = (" or ".join(found) if found
                                             else "more than 8 of any known accelerator")
        return text


def _plan(spec: ModelSpec, kind: str, count: int) -> Verdict | None:
    try:
        model = PlannedModel.real(spec)
    except PlanningError:  # no formula for its architecture yet: placed by budget alone
        return None
    try:
        gpus = GpuSet.of(kind, count)
    except PlanningError as exc:  # an accelerator this gateway's planner does not know
        return Verdict(False, f"{count}×{kind}", exc.message)
    best = plan(model, gpus)
    return Verdict(best.fits, str(gpus), best.reason, best)
