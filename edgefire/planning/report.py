"""The planner's words: one plan in detail, the GPU sets that host a model, and the catalog
table the README carries (tests/test_planning_cli.py checks the README holds this output)."""

from __future__ import annotations

from collections.abc import Iterable

from edgefire.planning.accelerators import ACCELERATORS, GIB, GpuSet
from edgefire.planning.model import PlannedModel
from edgefire.planning.plan import Plan, plan
from edgefire.planning.reserve import GPU_RESERVE

TABLE_SETS = ("1xL4", "1xH100", "2xH200", "8xH100")
SET_SIZES = (1, 2, 4, 8)  # the counts "which GPU sets" tries per accelerator
KIB = 1 << 10


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def tokens(n: int | None) -> str:
    if n is None:
        return "no KV"
    for unit, size in (("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}" if unit == "M" else f"{n // size}K"
    return str(n)


def describe(p: Plan) -> dict:
    """One plan as JSON-ready data (the CLI's --json, the fleet view's planner fields)."""
    return {
        "model": p.model, "gpus": str(p.gpus), "layout": str(p.layout), "codec": p.codec,
        "kv_dtype": p.kv_dtype, "fits": p.fits, "reason": p.reason, "params": p.params,
        "weight_bytes": p.weight_bytes, "weight_bytes_per_device": p.weight_bytes_per_device,
        "reserve_bytes_per_device": p.reserve_bytes_per_device, "kv_bytes": p.kv_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "local_kv_bytes_per_sequence": p.local_kv_bytes_per_sequence,
        "kv_tokens": p.tokens, "context_window": p.context_window,
    }


def lines(p: Plan) -> list[str]:
    """One plan for people, in GiB (2^30 bytes); a device's "80 GB" is its datasheet label."""
    a = p.gpus.accelerator
    out = [f"{p.model} on {p.gpus} ({a.memory_gb} GB, {gib(a.memory_bytes)} reported each), "
           f"layout {p.layout}, codec {p.codec}, KV {p.kv_dtype}",
           f"  params            {p.params / 1e9:.2f}B",
           f"  weights           {gib(p.weight_bytes)} in all, "
           f"{gib(p.weight_bytes_per_device)} on the fullest device",
           f"  reserve           {gib(p.reserve_bytes_per_device)} per device (runtime "
           f"{gib(GPU_RESERVE.runtime_bytes)}, activations of one step of "
           f"{GPU_RESERVE.step_tokens} tokens, logits of {GPU_RESERVE.max_seqs} sequences)"]
    if p.tokens is None:
        out.append("  KV                none (an encoder)")
    else:
        out.append(f"  KV per token      {p.kv_bytes_per_token / KIB:.1f} KiB (layers that "
                   "keep full-length KV)")
        if p.local_kv_bytes_per_sequence:
            out.append(f"  local KV          {gib(p.local_kv_bytes_per_sequence)} per sequence "
                       "at most (chunked-local layers keep one chunk)")
        out.append(f"  KV memory         {gib(p.kv_bytes)} in all")
        out.append(f"  KV capacity       {p.tokens:,} tokens "
                   f"({p.tokens / p.context_window:.1f} full {p.context_window}-token contexts)")
    out.append("  verdict           " + ("hosts it" if p.fits else f"cannot host: {p.reason}"))
    return out


def hosting(model: PlannedModel, kv_dtype: str = "bf16") -> list[Plan]:
    """Per accelerator, the smallest set of SET_SIZES that hosts model (best layout)."""
    found = []
    for accelerator in ACCELERATORS.values():
        for count in SET_SIZES:
            p = plan(model, GpuSet(accelerator, count), kv_dtype=kv_dtype)
            if p.fits:
                found.append(p)
                break
    return found


def cell(p: Plan) -> str:
    if not p.fits:
        return "✗ KV" if p.reason.startswith("KV") else "✗ weights"
    if p.tokens is None:
        return f"✓ {p.layout}"
    return f"✓ {gib(p.kv_bytes)} · {tokens(p.tokens)} tok · {p.layout}"


def table(models: Iterable[PlannedModel], sets: Iterable[str] = TABLE_SETS) -> str:
    """Markdown: each model's size and, per GPU set, its KV memory, token capacity and
    layout, or why it does not fit (✗ weights: weights and reserve exceed a device; ✗ KV:
    fewer KV tokens than plan.MIN_HOST_TOKENS or one context)."""
    gpus = [GpuSet.parse(s) for s in sets]
    head = ["model", "params", "weights", "KV/token", *map(str, gpus)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        plans = [plan(model, g) for g in gpus]
        first = plans[0]
        per_token = "—" if first.tokens is None else f"{first.kv_bytes_per_token / KIB:.1f} KiB"
        row = [model.id, f"{first.params / 1e9:.2f}B", gib(first.weight_bytes), per_token,
               *map(cell, plans)]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)
