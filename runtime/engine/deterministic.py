"""Deterministic mode: a request's tokens do not depend on what else runs in the batch.

Sampling is already batch-invariant (one seeded generator per request). Its logits are not:
measured on SmolLM2's projections (README, "Deterministic mode"), a float32 GEMM's row result
changes with the step's row count M (every M > 1 differs from M = 1), a bfloat16 one from
M = 33 on (another oneDNN kernel); chunk boundaries follow the token budget other requests
share; a prefix-cache hit replaces a prefill with a suffix-only one of another shape; and
"auto" precision picks the step's dtype by its token count. A deterministic request's
arithmetic is therefore made a function of the request alone:

- prefill runs in chunks on a fixed grid of positions (multiples of `chunk`, the last one
  ending at the prompt's end), each chunk in a forward pass of its own;
- every token after the prompt is computed one per step (also when a preempted request is
  recomputed, so its KV is rebuilt exactly as it was first made), and a step's deterministic
  decodes run apart from the rest, in one fixed dtype: where the model's own step computes
  each decode row bit for bit alike whatever shares it (the fused step:
  `batch_invariant_decode_rows`, which speculative decoding relies on too), in passes of up to
  that many rows through it; otherwise together in a pass whose projections are cut into
  fixed blocks of ROW_BLOCK rows (padded), a GEMM row's result measured not to depend on its
  position in a block nor on the block's other rows, only on the block's shape;
- the prefix cache is shared only among deterministic requests (their own salt) and only in
  whole grid chunks of a prompt, whose KV any deterministic request would compute identically.

The guarantee holds on one node configuration: same model, dtype, chunk, CPU and thread count.
"""

from __future__ import annotations

import enum

from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.engine.sequence import Sequence

# Rows per GEMM block in a deterministic decode pass through torch's layers: enough that 8
# decodes share one read of the weights, few enough that a lone decode wastes little on padding.
ROW_BLOCK = 8
# Prefill grid for deterministic requests, in tokens (capped by the step budget).
DEFAULT_CHUNK = 256
# Appended to a deterministic request's prefix-cache salt: its blocks are shared only with
# other deterministic requests, whose KV is computed on the same grid.
SALT_SUFFIX = b"/deterministic"


class Policy(enum.Enum):
    """Which requests a node runs deterministically (EDGEFIRE_DETERMINISTIC)."""

    OFF = "off"
    SEEDED = "seeded"  # requests that carry a seed
    ALL = "all"

    @classmethod
    def parse(cls, value: str | bool) -> Policy:
        """"1"/"true"/"all" -> ALL, "0"/"false"/"off" -> OFF, "seeded" -> SEEDED."""
        name = str(value).strip().lower()
        name = {"1": "all", "true": "all", "on": "all", "0": "off", "false": "off",
                "": "off"}.get(name, name)
        try:
            return cls(name)
        except ValueError:
            raise InvalidInputError("deterministic must be one of off, seeded, all (or 0/1)",
                                    field="deterministic") from None

    def applies(self, seed: int | None, requested: bool) -> bool:
        """Whether a request (its seed; `requested`: asked per request through the engine API)
        runs deterministically."""
        return requested or self is Policy.ALL or (self is Policy.SEEDED and seed is not None)


def grid_chunk(budget: int, block_size: int) -> int:
    """The node's prefill grid: DEFAULT_CHUNK, or at most half a step's budget, so that a chunk
    (never cut) still fits beside the running requests' decodes; whole KV blocks, so grid
    chunks and cacheable blocks line up. A budget under two blocks gets chunks of the whole
    budget, and no prefix reuse."""
    return min(DEFAULT_CHUNK, budget // 2) // block_size * block_size or max(budget, 1)


def num_new_tokens(seq: Sequence, done: int, chunk: int) -> int:
    """Tokens a deterministic seq with `done` tokens computed runs in its next step: the rest
    of its grid chunk while in the prompt, then one."""
    if done < seq.num_prompt_tokens:
        return min((done // chunk + 1) * chunk, seq.num_prompt_tokens) - done
    return 1


def reusable_hits(num_hit_blocks: int, chunk: int, block_size: int) -> int:
    """Cached blocks a deterministic seq may take: whole grid chunks only."""
    if chunk % block_size:
        return 0
    return num_hit_blocks * block_size // chunk * chunk // block_size


def publishable_blocks(seq: Sequence, chunk: int, block_size: int) -> int:
    """Blocks of a deterministic seq another may reuse: those of its prompt's whole chunks (a
    partial last chunk, or tokens decoded one per step, would be a prefill chunk elsewhere)."""
    if chunk % block_size:
        return 0
    return seq.num_prompt_tokens // chunk * chunk // block_size
