"""Draft-free speculative decoding: n-gram prompt lookup, verified in one batched step.

When a sequence's last few tokens occurred earlier in its prompt or output, the tokens that
followed them then are a cheap guess at what follows now (quoted text, code being edited,
lists, repetition). The guess is appended as draft tokens and the next step computes the
real last token and every draft at once, each as a decode row over the sequence's own pages
(row j attends to the context up to draft j). Verification keeps the drafts that equal the
model's own token for that row (its argmax, or for a sampled request its draw from that row,
drawn in order until one differs: runtime/engine/sampler.py) and adds the model's next token
after them, so the output is what one-token steps would have produced: the same choice over
the same rows, since the fused decode step computes each row the same whatever rows share its
step (models/fused), with the same draws.

It pays only while a step has rows to spare: a decode step reads every weight once whatever
its row count up to a few rows, so verifying 3 drafts costs ~1.1x a one-token step here
(bench/kernels.py), and nothing when no n-gram matches. So it runs for requests without
penalties, constraints or deterministic mode, only while the running batch with its drafts
fits `max_rows` rows of a batch-invariant step; a sampled request's drafts only while the step
stays within `sampled_step_rows` (their drafts stand about half as often as greedy ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edgefire.runtime.engine.sequence import Sequence

MODES = ("ngram", "off")


@dataclass(slots=True)
class SpeculativeConfig:
    mode: str = "ngram"
    num_draft_tokens: int = 3
    max_ngram: int = 3
    min_ngram: int = 2
    # Rows the model computes each independently of the others (the model's
    # batch_invariant_decode_rows: models/fused's MAX_ROWS, or 0 where drafts would not
    # give exactly the one-token steps' output).
    max_rows: int = 0
    # Rows a step may grow to with sampled requests' drafts. A decode step's time is nearly
    # flat only up to a few rows: on the 2-core Zen 4 1, 4, 8, 16, 32 rows took 9.0, 9.9,
    # 12.7, 21.4, 36.8 ms (bench/results/kernels.json). A sampled draft stands about half the
    # time (SmolLM2, temperature 0.7: 55 of 138, 133 of 253), so past 8 rows it costs more
    # than it wins. Greedy drafts stood 89-97% of the time in bench/engine.py's runs at one
    # and eight sequences, where 3 rows of drafts give ~2.7 tokens: they pay up to max_rows.
    sampled_step_rows: int = 8


def propose_ngram(tokens: list[int], num_draft: int, max_ngram: int, min_ngram: int
                  ) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the longest matching tail
    n-gram (max_ngram down to min_ngram), at most num_draft of them; [] when none matches."""
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(arr) <= n:
            continue
        windows = sliding_window_view(arr[:-1], n)  # every earlier n-gram, the tail excluded
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start:start + num_draft].tolist()
    return []


@dataclass(slots=True)
class Speculator:
    config: SpeculativeConfig
    num_steps: int = 0  # steps that verified drafts
    num_proposed: int = 0
    num_accepted: int = 0

    def eligible(self, seq: Sequence) -> bool:
        p = seq.params
        return (not p.has_penalties and seq.constraint is None and not seq.deterministic
                and seq.num_computed_tokens == seq.num_tokens - 1)

    def propose(self, running: list[Sequence]) -> None:
        """Append drafts to the running sequences, while their rows fit a fused step (and, for
        sampled requests, the step stays within sampled_step_rows)."""
        c = self.config
        if c.mode == "off" or not running or len(running) * (1 + c.num_draft_tokens) > c.max_rows:
            return
        rows = len(running)
        for seq in running:
            limit = c.max_rows if seq.params.greedy else c.sampled_step_rows
            if rows >= limit or not self.eligible(seq):
                continue
            # Never past max_tokens: the last allowed token is the model's own, not a draft.
            room = seq.params.max_tokens - seq.num_output_tokens - 1
            draft = propose_ngram(seq.token_ids, min(c.num_draft_tokens, room, limit - rows),
                                  c.max_ngram, c.min_ngram)
            if draft:
                seq.token_ids.extend(draft)
                seq.num_draft = len(draft)
                rows += len(draft)

    def withdraw(self, seqs: list[Sequence]) -> None:
        """Remove the drafts of sequences whose drafts will not be verified."""
        for seq in seqs:
            if seq.num_draft:
                del seq.token_ids[-seq.num_draft:]
                seq.num_draft = 0

    def accept(self, seq: Sequence, predicted: list[int]) -> list[int]:
        """Remove seq's drafts; return the tokens that stand: the drafts up to the first one
        the model disagrees with, then the model's own token there."""
        drafts = seq.token_ids[len(seq.token_ids) - seq.num_draft:]
        self.withdraw([seq])
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == predicted[accepted]:
            accepted += 1
        self.num_steps += 1
        self.num_proposed += len(drafts)
        self.num_accepted += accepted
        return predicted[:accepted + 1]
