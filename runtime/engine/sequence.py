"""A request's token state as the scheduler, block manager and runner see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.engine.structured import Constraint


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator
    salt: bytes = b""  # per-account: keeps one account's prefix-cache blocks from another's
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # hash chain over full blocks
    finish_reason: str | None = None
    constraint: Constraint | None = None  # structured output: what may come next
    # Batch-invariant arithmetic (runtime/engine/deterministic.py): fixed prefill grid, own
    # forward passes, prefix cache shared only on whole grid chunks.
    deterministic: bool = False
    # Speculative draft tokens at the end of token_ids, not yet verified
    # (runtime/engine/speculative.py): the next step computes them with the last real token.
    num_draft: int = 0
    arrival_time: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
