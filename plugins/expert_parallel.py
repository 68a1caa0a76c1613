"""Built-in parallel strategy "ep": expert parallelism for the MoE architectures (DeepSeek-V3
and Kimi K2.5, Llama 4): models/expert_parallel.py."""

from __future__ import annotations

from edgefire.models.expert_parallel import shard_experts
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import Collectives
from edgefire.runtime.parallel.root import SpawnedStrategy
from edgefire.runtime.plugins import hookimpl


class ExpertParallel(SpawnedStrategy):
    """Every rank holds the whole LM head and, after each block, the same hidden states: the
    root computes the logits."""

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: None) -> CausalLM:
        if not hasattr(model, "params"):
            raise ValueError(f"expert parallelism splits MoE models, not "
                             f"{type(model).__name__}")
        return shard_experts(model, rank, comm)


@hookimpl
def edgefire_register_parallel_strategies(register):
    register("ep", ExpertParallel())
