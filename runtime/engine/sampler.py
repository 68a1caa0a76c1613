"""Token sampling: penalties, grammar masks, greedy, temperature, top-k, top-p, seeded per
request.

Each request draws from its own torch.Generator, one draw a token, so a seeded request samples
the same tokens whatever else shares its batch, and with speculative drafts or without.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from edgefire.models.native import native_kernel
from edgefire.runtime.engine.sequence import Sequence

# The compiled module (sampling.cpp), or None: the torch path below then makes the same
# choices.
sampling_kernel = native_kernel("edgefire_sampling", Path(__file__).with_name("sampling.cpp"))


def _native(logits: torch.Tensor) -> ModuleType | None:
    kernel = sampling_kernel()
    usable = kernel is not None and logits.dtype == torch.float32 and logits.is_contiguous()
    return kernel if usable else None


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's first largest logit's index, as torch.max(dim=-1).indices gives it."""
    kernel = _native(logits)
    if kernel is None:
        # max(-1).indices, not argmax: the same first-of-ties index, but torch's argmax over
        # the last dim is a scalar loop on CPU (64 rows of 49,152 logits: 2.1 ms against 0.8).
        return logits.max(dim=-1).indices.tolist()
    return kernel.row_argmax(logits).tolist()


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """Repetition (over prompt and output, HF style) and OpenAI frequency/presence, in place.

    Logits the model made are inference tensors: call this under torch.inference_mode().
    """
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty,
                                   values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and seq.num_output_tokens:
        out = torch.tensor(seq.output_token_ids, dtype=torch.long)
        counts = torch.zeros_like(logits).index_add_(0, out, torch.ones(len(out)))
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


# top-p first looks for its nucleus among this many most likely tokens: where they hold at
# least top_p of the mass (nearly always, for a chat model) the nucleus lies within them, and
# the full vocabulary's sort (~1 ms at 49k tokens on 2 cores) is not needed.
TOP_P_CANDIDATES = 256


def top_k_top_p_mask(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus (1-D, copy)."""
    if top_k:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        full = logits.softmax(-1)
        probs, order = torch.topk(full, min(TOP_P_CANDIDATES, len(full)))
        if float(probs.sum()) < top_p:
            probs, order = torch.sort(full, descending=True)
        # Keep a token while the mass before it is below top_p: the top token always stays.
        keep = order[(probs.cumsum(-1) - probs) < top_p]
        masked = torch.full_like(logits, float("-inf"))
        masked[keep] = logits[keep]
        logits = masked
    return logits


def uniform(generator: torch.Generator) -> float:
    """A token's one draw from its request's generator: a uniform number in [0, 1)."""
    return float(torch.rand(1, generator=generator, dtype=torch.float64))


def sample(probs: torch.Tensor, u: float) -> int:
    """The token where probs' (1-D) cumulative sum passes u times their total. (Drawing an
    exponential per token for a race costs ~1 ms at 49k tokens on this CPU: a tenth of a
    decode step per sampled sequence.)"""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    target = torch.tensor([u], dtype=torch.float64) * cdf[-1]
    # The first token whose cumulative sum exceeds u: a token of probability 0 never is.
    return int(torch.searchsorted(cdf, target, right=True).clamp_(max=len(probs) - 1))


def sample_rows(logits: torch.Tensor, rows: list[int], seqs: list[Sequence]) -> list[int]:
    """One token for each of `rows` of logits, drawn for seqs (one each, in order) with the
    next uniform number of the sequence's generator."""
    if not rows:
        return []
    draws = [uniform(seq.generator) for seq in seqs]
    kernel = _native(logits)
    if kernel is not None:
        return kernel.sample_rows(logits, rows, [s.params.temperature for s in seqs],
                                  [s.params.top_k for s in seqs], [s.params.top_p for s in seqs],
                                  draws)
    tokens = []
    for row, seq, u in zip(rows, seqs, draws, strict=True):
        p = seq.params
        masked = top_k_top_p_mask(logits[row] / p.temperature, p.top_k, p.top_p)
        tokens.append(sample(masked.softmax(-1), u))
    return tokens


class Sampler:
    # The model makes its logits under inference mode, and inference tensors may be updated in
    # place only under inference mode: the penalties below do exactly that, row by row.
    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row of logits [num_seqs, vocab] (float32, modified in place)."""
        for row, seq in enumerate(seqs):
            if seq.params.has_penalties:
                apply_penalties(logits[row], seq)
            if seq.constraint is not None:
                logits[row].masked_fill_(seq.constraint.banned(), float("-inf"))
        tokens = greedy_tokens(logits)
        # Sampled rows without drafts: one draw each, all in one call.
        plain = [row for row, seq in enumerate(seqs)
                 if not seq.params.greedy and not seq.num_draft]
        for row, token in zip(plain, sample_rows(logits, plain, [seqs[r] for r in plain]),
                              strict=True):
            tokens[row] = token
        verified: dict[Sequence, int] = {}  # a drafted sequence's rows sampled so far, or -1
        for row, seq in enumerate(seqs):
            if seq.params.greedy or not seq.num_draft:
                continue
            # Rows verifying drafts are sampled in order, each with the request's next draw,
            # until one differs from its draft: the tokens that stand are then those one-token
            # steps would have sampled with the same draws (the rows' logits are the same
            # whatever shares the step), and no draw is spent on a row that is discarded, so
            # a seeded request samples the same tokens with drafts or without. A row after
            # the first miss keeps its argmax, which Speculator.accept never reads.
            j = verified.get(seq, 0)
            if j < 0:
                continue
            tokens[row] = sample_rows(logits, [row], [seq])[0]
            drafts = seq.token_ids[len(seq.token_ids) - seq.num_draft:]
            verified[seq] = j + 1 if j < len(drafts) and tokens[row] == drafts[j] else -1
        return tokens
