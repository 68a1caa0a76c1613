"""Built-in parallel strategy "tp": tensor parallelism for Llama-architecture models."""

from __future__ import annotations

from edgefire.models.llama import LlamaForCausalLM
from edgefire.models.tensor_parallel import shard_llama
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import Collectives
from edgefire.runtime.parallel.root import SpawnedStrategy
from edgefire.runtime.plugins import hookimpl


class TensorParallel(SpawnedStrategy):
    def vocab_ranks(self, layout: ParallelLayout) -> int:
        return layout.tp  # each rank holds a slice of the vocabulary

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: None) -> CausalLM:
        if not isinstance(model, LlamaForCausalLM):
            raise ValueError(f"tensor parallelism splits Llama-architecture models, not "
                             f"{type(model).__name__}")
        return shard_llama(model, rank, layout.tp, comm.all_reduce)


@hookimpl
def edgefire_register_parallel_strategies(register):
    register("tp", TensorParallel())
