"""Plans: a model on a GPU set in a layout (tensor × pipeline × expert parallel), per device
weights, reserve and KV memory, and the resulting token capacity; the best layout; the sets
that host.

Layout rules, as Infire splits large models (PP and TP together, stages load-balanced):
- tensor parallelism (tp) shards projections by heads or channels, embeddings by vocabulary and
  experts across ranks; norms and routers are replicated. GQA K/V split by KV head (a rank
  keeps at least one); MLA's latent is shared by all heads, so every rank keeps it whole;
- pipeline parallelism (pp) gives each stage contiguous layers, balanced by weight bytes, the
  embeddings to the first stage and the LM head to the last; a stage keeps only its layers' KV;
- expert parallelism (ep) splits the routed experts over ep ranks (within each tensor-parallel
  shard) and replicates everything else, attention and its KV included, as the node's ep
  strategy does (plugins/expert_parallel.py). The best-layout search leaves it out: on these
  devices tp frees at least as much memory per device, since it also splits attention.
A token needs KV on every stage, so capacity is the smallest any device allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from edgefire.contract.errors import PlanningError
from edgefire.planning.accelerators import GIB, GpuSet
from edgefire.planning.model import (
    PlannedModel,
    group_bytes,
    kv_bytes_per_token,
    layer_bytes,
    local_kv_bytes_per_sequence,
)
from edgefire.planning.precisions import kv_element_bytes
from edgefire.planning.reserve import GPU_RESERVE, Reserve
from edgefire.planning.shapes import Layer, Weights

# A site hosts a model when its KV holds at least this many tokens (or one full context
# window, if shorter): room for one long request, below which it could not serve real traffic.
MIN_HOST_TOKENS = 32768


@dataclass(slots=True, frozen=True)
class Layout:
    tp: int
    pp: int
    ep: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.ep

    @classmethod
    def parse(cls, text: str) -> Layout:
        """`tp8`, `pp2`, `ep8`, `tp4pp2` (any order)."""
        parts = {"tp": 1, "pp": 1, "ep": 1}
        rest = text.strip().lower().replace("×", "").replace("x", "")
        while rest:
            key, rest = rest[:2], rest[2:]
            digits = len(rest) - len(rest.lstrip("0123456789"))
            if key not in parts or not digits:
                raise PlanningError(f"layout {text!r} is not like tp8, pp2, ep8 or tp4pp2",
                                    field="layout")
            parts[key], rest = int(rest[:digits]), rest[digits:]
        return cls(parts["tp"], parts["pp"], parts["ep"])

    def __str__(self) -> str:
        axes = (("tp", self.tp), ("pp", self.pp), ("ep", self.ep))
        return "×".join(f"{k}{v}" for k, v in axes if v > 1) or "tp1"


@dataclass(slots=True, frozen=True)
class Device:
    """One device of the plan (devices of a stage are alike; one stands for its stage)."""

    stage: int
    weight_bytes: int
    reserve_bytes: int
    kv_bytes: int  # what is left for KV (0 when weights and reserve do not fit)
    kv_bytes_per_token: int  # full-length layers of this stage, this rank's share
    local_kv_bytes_per_sequence: int
    tokens: int | None  # KV capacity in full-length tokens; None: no KV (an encoder)
    fits: bool


@dataclass(slots=True, frozen=True)
class Plan:
    model: str
    gpus: GpuSet
    layout: Layout
    codec: str
    kv_dtype: str
    params: int
    weight_bytes: int  # all devices together
    stages: tuple[Device, ...]
    kv_bytes_per_token: int  # the model's, full-length layers, unsharded
    local_kv_bytes_per_sequence: int
    context_window: int
    fits: bool
    reason: str  # why it does not fit, or "" when it does

    @property
    def kv_bytes(self) -> int:
        """KV memory on all devices together (Infire's "left for KV cache")."""
        return sum(d.kv_bytes for d in self.stages) * self.layout.tp * self.layout.ep

    @property
    def tokens(self) -> int | None:
        capacities = [d.tokens for d in self.stages if d.tokens is not None]
        return min(capacities) if capacities else None

    @property
    def weight_bytes_per_device(self) -> int:
        return max(d.weight_bytes for d in self.stages)

    @property
    def reserve_bytes_per_device(self) -> int:
        return max(d.reserve_bytes for d in self.stages)


def stages(costs: list[float], pp: int) -> list[range]:
    """Split layers with these costs into pp contiguous non-empty stages, minimising the
    largest stage's cost (exact, by dynamic programming over split points)."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    best = [[math.inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    bounds, i = [], n
    for k in range(pp, 0, -1):
        bounds.append(range(cut[k][i], i))
        i = cut[k][i]
    return bounds[::-1]


def _kv_share(layer: Layer, tp: int, per: float, local: bool) -> float:
    kv = layer.kv
    if kv is None or (kv.window is None) == local:
        return 0.0
    elements = kv.elements if kv.heads == 0 else kv.elements * math.ceil(kv.heads / tp) / kv.heads
    return elements * per * (kv.window if local else 1)


def _shards(w: Weights, tp: int, ep: int) -> int:
    """Over how many devices of a stage one copy of w is spread."""
    if w.replicated:
        return 1
    return tp * ep if w.role == "routed_experts" else tp


def plan_layout(model: PlannedModel, gpus: GpuSet, layout: Layout, *, kv_dtype: str = "bf16",
                seqs: int = 1, reserve: Reserve = GPU_RESERVE) -> Plan:
    """model on gpus in layout; `seqs` sequences' chunked-local KV is set aside first."""
    s, tp, pp, ep = model.shape, layout.tp, layout.pp, layout.ep
    if layout.devices != gpus.count or min(tp, pp, ep) < 1:
        raise PlanningError(f"layout {layout} needs {layout.devices} devices, the set has "
                            f"{gpus.count}", field="layout")
    if pp > len(s.layers):
        raise PlanningError(f"{model.id} has {len(s.layers)} layers, fewer than {pp} stages",
                            field="layout")
    per = kv_element_bytes(kv_dtype)
    ends = [sum(group_bytes(model, w) for w in part) for part in (s.head, s.tail)]
    costs = [layer_bytes(model, layer) for layer in s.layers]
    costs[0] += ends[0]
    costs[-1] += ends[1]
    memory = gpus.accelerator.memory_bytes
    devices = []
    for index, span in enumerate(stages(costs, pp)):
        layers = [s.layers[i] for i in span]
        groups = [w for layer in layers for w in layer.weights]
        groups += list(s.head) if index == 0 else []
        groups += list(s.tail) if index == pp - 1 else []
        weights = round(sum(group_bytes(model, w) / _shards(w, tp, ep) for w in groups))
        held = reserve.device_bytes(s, layers, tp, last=index == pp - 1)
        free = memory - weights - held
        full = round(sum(_kv_share(layer, tp, per, local=False) for layer in layers))
        local = round(sum(_kv_share(layer, tp, per, local=True) for layer in layers))
        tokens = None
        if not s.encoder:
            room = max(free, 0) - seqs * local
            tokens = max(room, 0) // full if full else (math.inf if room >= 0 else 0)
        devices.append(Device(index, weights, held, max(free, 0), full, local,
                              None if tokens is None else min(tokens, 10**12), free >= 0))
    return _verdict(model, gpus, layout, kv_dtype, devices, memory)


def _verdict(model: PlannedModel, gpus: GpuSet, layout: Layout, kv_dtype: str,
             devices: list[Device], memory: int) -> Plan:
    weights = sum(d.weight_bytes for d in devices) * layout.tp * layout.ep
    plan = Plan(model.id, gpus, layout, model.codec, kv_dtype, model.shape.params, weights,
                tuple(devices), kv_bytes_per_token(model, kv_dtype),
                local_kv_bytes_per_sequence(model, kv_dtype), model.context_window, True, "")
    worst = max(devices, key=lambda d: d.weight_bytes + d.reserve_bytes)
    if not worst.fits:
        reason = (f"weights need {worst.weight_bytes / GIB:.1f} GiB per device plus "
                  f"{worst.reserve_bytes / GIB:.1f} GiB reserve; each "
                  f"{gpus.accelerator.name} has {memory / GIB:.1f} GiB")
        return _replace(plan, reason)
    need = min(model.context_window, MIN_HOST_TOKENS)
    if plan.tokens is not None and plan.tokens < need:
        return _replace(plan, f"KV holds {plan.tokens} tokens, fewer than {need}")
    return plan


def _replace(plan: Plan, reason: str) -> Plan:
    return replace(plan, fits=False, reason=reason)


def layouts(gpus: GpuSet, num_layers: int) -> list[Layout]:
    return [Layout(tp, gpus.count // tp) for tp in range(gpus.count, 0, -1)
            if gpus.count % tp == 0 and gpus.count // tp <= num_layers]


def plan(model: PlannedModel, gpus: GpuSet, layout: Layout | None = None, *,
         kv_dtype: str = "bf16", seqs: int = 1, reserve: Reserve = GPU_RESERVE) -> Plan:
    """The plan for layout, or the best layout: of those that fit, the most KV tokens (an
    encoder: the most free memory), fewer pipeline stages on a tie; if none fits, the one
    closest to fitting, so its reason says how far off it is."""
    if layout is not None:
        return plan_layout(model, gpus, layout, kv_dtype=kv_dtype, seqs=seqs, reserve=reserve)
    options = [plan_layout(model, gpus, candidate, kv_dtype=kv_dtype, seqs=seqs,
                           reserve=reserve)
               for candidate in layouts(gpus, len(model.shape.layers))]

    def rank(p: Plan) -> tuple:
        slack = min(d.kv_bytes for d in p.stages) if p.fits else -max(
            d.weight_bytes + d.reserve_bytes for d in p.stages)
        return (p.fits, p.tokens or 0, slack, -p.layout.pp)

    return max(options, key=rank)
