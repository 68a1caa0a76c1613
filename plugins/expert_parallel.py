"""Built-in parallel strategy "ep": expert parallelism for the MoE architectures (DeepSeek-V3
and Kimi K2.5, Llama 4): models/expert_parallel.py."""

from __future__ import annotations

from edgefire.models.expert_parallel import shard_experts
from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading.loaded import LoadedLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import Collectives
from edgefire.runtime.parallel.root import launch
from edgefire.runtime.plugins import hookimpl


class ExpertParallel:
    gathers_logits = False  # every rank holds the whole LM head and the same hidden states

    def launch(self, loaded: LoadedLM, layout: ParallelLayout,
               precision: Precision) -> LoadedLM:
        return launch(loaded, layout, precision, self)

    def plan(self, model: CausalLM, layout: ParallelLayout) -> None:
        return None  # every rank's experts follow from its rank alone

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: None) -> CausalLM:
        if not hasattr(model, "params"):
            raise ValueError(f"expert parallelism splits MoE models, not "
                             f"{type(model).__name__}")
        return shard_experts(model, rank, comm)


@hookimpl
def edgefire_register_parallel_strategies(register):
    register("ep", ExpertParallel())
