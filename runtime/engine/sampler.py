"""Token sampling: penalties, grammar masks, greedy, temperature, top-k, top-p, seeded per
request.

Each request draws from its own torch.Generator, so a seeded request samples the same tokens
whatever else shares its batch.
"""

from __future__ import annotations

import torch

from edgefire.runtime.engine.sequence import Sequence


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


def top_k_top_p_mask(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus (1-D, copy)."""
    if top_k:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Keep a token while the mass before it is below top_p: the top token always stays.
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone() if not top_k else logits
        logits[order[drop]] = float("-inf")
    return logits


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
                logits[row].masked_fill_(~seq.constraint.allowed(), float("-inf"))
        tokens = logits.argmax(dim=-1).tolist()
        for row, seq in enumerate(seqs):
            if not seq.params.greedy:
                tokens[row] = self._sample_row(logits[row], seq)
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        logits = top_k_top_p_mask(logits / p.temperature, p.top_k, p.top_p)
        probs = logits.softmax(-1)
        # Exponential race (Gumbel-max in probability space): argmax(p / E), E ~ Exp(1), draws
        # from p with one vector op and one draw from this request's own generator.
        noise = torch.empty_like(probs).exponential_(generator=seq.generator)
        return int((probs / noise).argmax())
