"""Built-in parallel strategies "pp" and "pp+tp": pipeline parallelism for Llama-architecture
models, each stage on one rank or split over tp by tensor parallelism.

Stages are contiguous layers, cut where the balancer (models/pipeline_parallel.py) finds the
slowest stage least slow on each layer's cost measured at load; each step is cut into
micro-batches so that the stages work at once (runtime/parallel/pipeline.py). With tp, each
stage's ranks hold Megatron shards of its layers (models/tensor_parallel.py) and the first
stage's split its embedding and LM head by vocabulary, as tp alone does.
"""

from __future__ import annotations

from edgefire.models.llama import LlamaForCausalLM
from edgefire.models.pipeline_parallel import balance, measure_costs, stage_llama
from edgefire.models.tensor_parallel import shard_llama
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import Collectives
from edgefire.runtime.parallel.pipeline import PipelineRank
from edgefire.runtime.parallel.root import SpawnedStrategy
from edgefire.runtime.plugins import hookimpl

# Micro-batches per stage: with p stages and m micro-batches a step idles (p-1)/(m+p-1) of
# each stage's time (GPipe's bubble); more, smaller ones cost GEMM efficiency per row.
MICRO_BATCHES_PER_STAGE = 2


class PipelineParallel(SpawnedStrategy):
    """The root's stage holds the LM head: it computes the logits, or with tp its lanes
    each a slice of them."""

    def vocab_ranks(self, layout: ParallelLayout) -> int:
        return layout.tp  # the first stage's lanes: ranks 0 … tp-1

    def plan(self, model: CausalLM, layout: ParallelLayout) -> list[range]:
        """Each stage's layers, from their cost measured here on the model as loaded."""
        llama = _llama(model)
        costs, ends = measure_costs(llama, llama.dtypes[0])
        return balance(costs, layout.pp, first_extra=ends)

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: list[range]) -> CausalLM:
        index, lane = divmod(rank, layout.tp)
        stage = stage_llama(_llama(model), plan[index], first=index == 0)
        if layout.tp > 1:
            lanes = comm.subgroup(range(index * layout.tp, (index + 1) * layout.tp))
            stage = shard_llama(stage, lane, layout.tp, lanes.all_reduce)
        return PipelineRank(stage, rank, layout.pp, comm, MICRO_BATCHES_PER_STAGE * layout.pp,
                            layout.tp)


def _llama(model: CausalLM) -> LlamaForCausalLM:
    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"pipeline parallelism splits Llama-architecture models, not "
                         f"{type(model).__name__}")
    return model


@hookimpl
def edgefire_register_parallel_strategies(register):
    register("pp", PipelineParallel())
    register("pp+tp", PipelineParallel())
