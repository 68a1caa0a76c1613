"""A snapshot of the engine's load, for heartbeats and metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineStats:
    """Counts by unit; the prefix and preemption counters run from the engine's start."""

    num_running: int  # sequences the scheduler runs
    num_waiting: int  # sequences queued in the scheduler, not yet admitted
    num_kv_blocks_used: int  # held by sequences (prefix-cached blocks no one holds are free)
    num_kv_blocks: int  # the pool's size
    num_prefix_queried_tokens: int  # prompt tokens looked up in the prefix cache
    num_prefix_hit_tokens: int  # of those, tokens found there
    num_prefix_remote_hit_tokens: int  # of the hits, tokens whose pages came from a KV store
    num_preemptions: int  # sequences preempted, to be recomputed
    num_draft_tokens: int  # speculative draft tokens verified
    num_accepted_draft_tokens: int  # of those, drafts that stood

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, 0..1."""
        return self.num_kv_blocks_used / self.num_kv_blocks
