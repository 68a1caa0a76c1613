"""What a parallel-strategy plugin registers (edgefire_register_parallel_strategies)."""

from __future__ import annotations

from typing import Any, Protocol

from edgefire.runtime.engine.model_runner import CausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading.loaded import LoadedLM
from edgefire.runtime.loading.parallel_layout import ParallelLayout
from edgefire.runtime.parallel.collectives import Collectives


class ParallelStrategy(Protocol):
    def vocab_ranks(self, layout: ParallelLayout) -> int:
        """How many ranks, from the root on, each compute a slice of the vocabulary's logits
        (split by models.tensor_parallel.split) for the root to gather; 1 where the root
        computes them all."""
        ...

    def launch(self, loaded: LoadedLM, layout: ParallelLayout,
               precision: Precision) -> LoadedLM:
        """loaded (the whole model, in the node's process, loaded at precision) served in
        layout: workers started, the model replaced by the root rank's driver
        (runtime/parallel/root.py: launch)."""
        ...

    def plan(self, model: CausalLM, layout: ParallelLayout) -> Any:
        """What every rank needs to know to shard alike, decided once on the root (which
        layers each pipeline stage holds, say); it travels to the workers pickled."""
        ...

    def shard(self, model: CausalLM, rank: int, layout: ParallelLayout, comm: Collectives,
              plan: Any) -> CausalLM:
        """Rank's part of model, meeting the other ranks through comm. On the root, its
        forward returns the step's final hidden states. Raises ValueError where the model
        cannot be split so."""
        ...
