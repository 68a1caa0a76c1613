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
