"""A pipeline stage's part of each step, on every rank of a pp layout.

A step's rows are cut into micro-batches (models/attention: micro_batches): the root embeds
and runs its layers on the first and sends it on, then runs the next while the second stage
runs the first, and so on; the last stage normalises each and sends it back to the root, which
computes the logits with the LM head it holds. Sends are started without waiting, so no stage
waits on another's receive being posted. The root's time waiting for the other stages (the
pipeline's bubble, seen from the root) is kept for bench/parallel.py.

Combined with tensor parallelism (pp+tp), each stage is tp ranks, numbered stage by stage
(rank = stage·tp + lane): a stage's lanes run its layers' shards together, meeting in their
own all-reduces, and each lane sends its micro-batch on to the same lane of the next stage
(after the all-reduces every lane holds the whole residual stream); lane 0 of the last stage
sends it back to the root.
"""

from __future__ import annotations

import time

import torch

from edgefire.models.attention import AttentionMetadata, micro_batches
from edgefire.models.llama import LlamaForCausalLM
from edgefire.runtime.parallel.collectives import ROOT, Collectives

# A micro-batch of fewer rows is not worth its own pass: a decode step's layers cost per call
# (torch's dispatch, ~1 ms a layer on CPU) more than per row, so cutting 8 decodes into four
# passes of 2 took SmolLM2's two-stage step from ~60 to 220 ms on a 2-core Xeon.
MIN_MICRO_BATCH_ROWS = 16


class PipelineRank:
    def __init__(self, stage: LlamaForCausalLM, rank: int, stages: int, comm: Collectives,
                 parts: int, tp: int = 1) -> None:
        """stage: this rank's layers (its tensor-parallel shard of them where tp > 1); comm:
        every rank's collectives."""
        self.stage = stage
        self.rank = rank
        self.stages = stages
        self.tp = tp
        self.comm = comm
        self.parts = parts  # micro-batches a step is cut into, at most
        self.dtypes = stage.dtypes
        self.kv_dtype = stage.kv_dtype
        self.weight_precision = stage.weight_precision
        self.compute_s = 0.0  # this rank's time computing its layers

    @property
    def weight_bytes(self) -> int:
        return self.stage.weight_bytes

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return self.stage.kv_cache_shape(num_blocks, block_size)  # its layers' pages

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor,
                dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """On the root, the step's final hidden states (every stage run); elsewhere None."""
        dtype = dtype or self.dtypes[0]
        width = self.stage.config.hidden_size
        index, lane = divmod(self.rank, self.tp)
        last = index == self.stages - 1
        # Where each micro-batch goes next: the same lane of the next stage; from the last
        # stage, lane 0's back to the root (the other lanes hold the same rows).
        after = None if last and lane else ROOT if last else self.rank + self.tp
        parts = max(1, min(self.parts, input_ids.shape[0] // MIN_MICRO_BATCH_ROWS))
        runs = micro_batches(meta, parts)
        sends = []
        for tag, (rows, part) in enumerate(runs):
            if index == 0:
                h = self.stage.embed_tokens(input_ids[rows.start:rows.stop], dtype)
            else:
                h = self.comm.recv(torch.empty(len(rows), width, dtype=dtype),
                                   self.rank - self.tp, tag)
            started = time.perf_counter()
            h = self.stage.run_layers(h, positions[rows.start:rows.stop], part, kv_cache,
                                      dtype)
            if last:
                h = self.stage.final_norm(h)
            self.compute_s += time.perf_counter() - started
            if after is not None:
                sends.append((h, self.comm.send(h, after, tag)))
        out = None
        if self.rank == ROOT:
            out = torch.cat([self.comm.recv(torch.empty(len(rows), width, dtype=dtype),
                                            (self.stages - 1) * self.tp, tag)
                             for tag, (rows, _) in enumerate(runs)])
        self.comm.finish([work for _, work in sends])
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """On the first stage, which holds the LM head (with tp, each lane its vocabulary
        slice's columns)."""
        return self.stage.compute_logits(hidden)
