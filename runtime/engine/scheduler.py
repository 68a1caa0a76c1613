"""Continuous batching under a per-step token budget.

One rule covers prefill, chunked prefill, decode and resume after preemption: every scheduled
sequence catches its computed tokens up towards its known tokens, as far as the budget allows.
Running sequences go first (FCFS); new ones are admitted only in steps that preempted nothing.
A deterministic sequence instead steps on its fixed grid (runtime/engine/deterministic.py): its
step is never cut by the budget; if it does not fit, it waits for a later step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from edgefire.runtime.engine import deterministic
from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_scheduled_tokens.append(num_tokens)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.blocks = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.chunk = deterministic.grid_chunk(config.max_num_batched_tokens,
                                              block_manager.block_size)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.deterministic:
                num_new = deterministic.num_new_tokens(seq, seq.num_computed_tokens, self.chunk)
                if num_new > budget:
                    i += 1  # its whole grid step, next time
                    continue
            else:
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.allocate(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.add(seq, num_new)
                budget -= num_new
                i += 1
                continue
            break
        if not batch.preempted:
            self._admit(batch, budget)
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self.blocks.find_cached_blocks(seq)
            if seq.deterministic:
                del cached[deterministic.reusable_hits(len(cached), self.chunk,
                                                       self.blocks.block_size):]
            num_cached_tokens = len(cached) * self.blocks.block_size
            if seq.deterministic:
                num_new = deterministic.num_new_tokens(seq, num_cached_tokens, self.chunk)
                if num_new > budget:
                    break
            else:
                num_new = min(seq.num_tokens - num_cached_tokens, budget)
            if not self.blocks.allocate(seq, num_new, cached):
                break  # FCFS: later arrivals do not jump a request that does not fit yet
            self.blocks.record_prefix_query(seq.num_tokens, cached)
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached_tokens
            if seq.num_output_tokens == 0:
                seq.num_cached_tokens = num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.add(seq, num_new)
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        # Recompute, not swap: the sequence's KV is dropped and rebuilt from its tokens (prompt
        # and output so far) when it is admitted again, ahead of every other waiting request.
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq finished and free its blocks at once, wherever it is queued."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
