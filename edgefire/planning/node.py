"""What a node on this machine needs to load a catalog model: its memory budget entry.

The same formulas as for GPUs, with this machine's profile: a text model's weights in the
node's compute dtype (bfloat16: `auto` on this CPU, which has native bfloat16 dot products),
then the catalog's codec; its KV pool (EDGEFIRE_KV_CACHE_MIB, whole blocks of every layer, as
the engine allocates it); one step's activations and logits; a runtime share. An encoder
holds float32 weights (EMBEDDING_DTYPE) and no KV. A runnable miniature is planned from its
miniature config; placement uses the real config on a city's GPUs (edgefire.planning.plan).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefire.contract.cpu import auto_dense_formats
from edgefire.contract.errors import PlanningError
from edgefire.planning.model import (
    CatalogEntry,
    PlannedModel,
    dense_copy_bytes,
    kv_bytes_per_token,
    weight_bytes,
)
from edgefire.planning.reserve import MIB, Reserve


@dataclass(slots=True, frozen=True)
class NodeProfile:
    dense: str  # compute dtype(s) of a text model's weights, "+"-joined when it holds several
    encoder_dense: str
    kv_dtype: str
    kv_pool_bytes: int  # per text model (NodeSettings.kv_cache_mib reads it as its default)
    block_size: int  # tokens per KV page (EngineConfig.block_size)
    reserve: Reserve
    encoder_reserve: Reserve


# Defaults of the node's settings (runtime/node/settings.py takes kv_pool, max_num_seqs and
# max_num_batched_tokens from here). 64 MiB per model is an allowance for the tokenizer, Python
# objects and allocator slack, not a measurement: RSS cannot isolate it here (KV pages are
# touched lazily and warm-start weights are memory-mapped, so RSS grows by less than the
# tensors' bytes on a SmolLM2 load).
CPU_NODE = NodeProfile(
    dense="+".join(auto_dense_formats()), encoder_dense="fp32", kv_dtype="bf16",
    kv_pool_bytes=512 * MIB,
    block_size=16,
    reserve=Reserve(runtime_bytes=64 * MIB, step_tokens=1024, max_seqs=64),
    encoder_reserve=Reserve(runtime_bytes=64 * MIB, step_tokens=1024, max_seqs=0,
                            act_bytes=4))


@dataclass(slots=True, frozen=True)
class NodeNeed:
    weight_bytes: int
    kv_pool_bytes: int
    reserve_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_pool_bytes + self.reserve_bytes


def kv_pool_bytes(model: PlannedModel, profile: NodeProfile = CPU_NODE) -> int:
    """The pool the engine allocates: as many whole blocks as the budget holds."""
    block = profile.block_size * kv_bytes_per_token(model, profile.kv_dtype, all_layers=True)
    return profile.kv_pool_bytes // block * block if block else 0


def node_need(model: PlannedModel, profile: NodeProfile = CPU_NODE) -> NodeNeed:
    s = model.shape
    if s.encoder:
        reserve = profile.encoder_reserve.device_bytes(s, s.layers, 1, last=True)
        return NodeNeed(weight_bytes(model, profile.encoder_dense), 0, reserve)
    reserve = profile.reserve.device_bytes(s, s.layers, 1, last=True)
    first, *more = profile.dense.split("+")
    weights = weight_bytes(model, first) + sum(dense_copy_bytes(model, d) for d in more)
    return NodeNeed(weights, kv_pool_bytes(model, profile), reserve)


def need_bytes(spec: CatalogEntry, profile: NodeProfile = CPU_NODE) -> int:
    """ModelSpec.need_bytes: what a node here must have free to load spec; 0 when there is
    nothing to plan from (no config, or an architecture or codec plugin the planner has no
    formula for): the node loads it and counts what it measures, as for any model."""
    try:
        model = PlannedModel.on_this_machine(spec)
    except PlanningError:
        return 0
    return 0 if model is None else node_need(model, profile).total
