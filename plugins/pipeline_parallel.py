"""Built-in parallel strategy "pp": pipeline parallelism for Llama-architecture models.

Stages are contiguous layers, cut where the balancer (models/pipeline_parallel.py) finds the
slowest stage least slow on each layer's cost measured at load; each step is cut into
micro-batches so that the stages work at once (runtime/parallel/pipeline.py).
"""

from __future__ import annotations

from edgefire.models.llama import LlamaForCausalLM
from edgefire.models.pipeline_parallel import balance, measure_costs, stage_llama
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import ROOT, Collectives
from edgefire.runtime.parallel.pipeline import PipelineRank
from edgefire.runtime.parallel.root import SpawnedStrategy
from edgefire.runtime.plugins import hookimpl

# Micro-batches per stage: with p stages and m micro-batches a step idles (p-1)/(m+p-1) of
# each stage's time (GPipe's bubble); more, smaller ones cost GEMM efficiency per row.
MICRO_BATCHES_PER_STAGE = 2


class PipelineParallel(SpawnedStrategy):
    """The root's stage holds the LM head: it computes the logits."""

    def plan(self, model: CausalLM, layout: ParallelLayout) -> list[range]:
        """Each stage's layers, from their cost measured here on the model as loaded."""
        llama = _llama(model)
        costs, ends = measure_costs(llama, llama.dtypes[0])
        return balance(costs, layout.pp, first_extra=ends)

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: list[range]) -> CausalLM:
        stage = stage_llama(_llama(model), plan[rank], first=rank == ROOT)
        return PipelineRank(stage, rank, layout.pp, comm, MICRO_BATCHES_PER_STAGE * layout.pp)


def _llama(model: CausalLM) -> LlamaForCausalLM:
    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"pipeline parallelism splits Llama-architecture models, not "
                         f"{type(model).__name__}")
    return model


@hookimpl
def edgefire_register_parallel_strategies(register):
    register("pp", PipelineParallel())
