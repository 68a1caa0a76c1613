"""Per-step attention metadata, built once by the model runner and shared by every layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PrefillSpan:
    """One sequence that computes more than one token this step (a prompt chunk)."""

    token_start: int  # first row of this span in the step's packed token batch
    num_tokens: int
    context_len: int  # tokens in the KV cache after this step, the span included
    block_table: torch.Tensor  # [num_blocks] int64
    # Bool mask [num_tokens, context_len]; None when the span is the whole context (plain causal).
    mask: torch.Tensor | None
    # The mask only spells out causal attention for queries at the context's end (a later
    # prompt chunk, a prefix-cache hit), so a causal kernel may stand in for it.
    mask_is_causal: bool = False


@dataclass(slots=True)
class AttentionMetadata:
    """Where each new token's K/V goes and what each query attends to.

    Decode tokens (one per sequence) come first in the packed batch, prefill spans after them,
    so decodes are attended to as one batch and each prefill span on its own.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int64, padded with 0
    decode_context_lens: torch.Tensor  # [num_decodes] int64, the new token included
    decode_mask: torch.Tensor  # [1, num_decodes, 1, max_blocks * block_size] bool
    prefills: list[PrefillSpan]


def split_decodes(meta: AttentionMetadata) -> tuple[AttentionMetadata, AttentionMetadata]:
    """A step's decodes (its first num_decode_tokens rows) and its prompt chunks (the rest) as
    the metadata of two steps, for a model that computes them apart."""
    n = meta.num_decode_tokens
    decodes = AttentionMetadata(meta.slot_mapping[:n], n, meta.decode_block_tables,
                                meta.decode_context_lens, meta.decode_mask, [])
    prompts = AttentionMetadata(
        meta.slot_mapping[n:], 0, meta.decode_block_tables[:0], meta.decode_context_lens[:0],
        meta.decode_mask[:, :0],
        [dataclasses.replace(span, token_start=span.token_start - n) for span in meta.prefills])
    return decodes, prompts


def micro_batches(meta: AttentionMetadata, parts: int) -> list[tuple[range, AttentionMetadata]]:
    """A step cut into at most `parts` runs of its rows, each with the metadata of a step of
    its own (a pipeline stage works on one while the next stage works on the one before).
    Runs hold about as many rows each; decodes split anywhere, a prompt chunk stays whole.
    Computed one after another in order, they write and read the cache as the whole step does:
    a later run's queries see the K/V an earlier run of the same step wrote."""
    d = meta.num_decode_tokens
    # the step's rows as units that may not be cut: one per decode, one per prompt chunk
    units = [(r, r + 1) for r in range(d)]
    units += [(s.token_start, s.token_start + s.num_tokens) for s in meta.prefills]
    total = units[-1][1] if units else 0
    cuts: list[range] = []
    start = 0
    for i, (_, end) in enumerate(units):
        runs_left = parts - len(cuts)
        if i == len(units) - 1 or runs_left > 1 and end - start >= (total - start) / runs_left:
            cuts.append(range(start, end))
            start = end
    return [(rows, _slice(meta, rows)) for rows in cuts]


def _slice(meta: AttentionMetadata, rows: range) -> AttentionMetadata:
    d = meta.num_decode_tokens
    decodes = range(min(rows.start, d), min(rows.stop, d))
    return AttentionMetadata(
        meta.slot_mapping[rows.start:rows.stop], len(decodes),
        meta.decode_block_tables[decodes.start:decodes.stop],
        meta.decode_context_lens[decodes.start:decodes.stop],
        meta.decode_mask[:, decodes.start:decodes.stop],
        [dataclasses.replace(span, token_start=span.token_start - rows.start)
         for span in meta.prefills if span.token_start in rows])
