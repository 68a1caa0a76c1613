"""Chunked local attention (Llama 4): a token attends only to earlier tokens of its own chunk.

Positions are cut into chunks of `chunk_size` tokens ([0, C), [C, 2C), …); a query at position
p sees keys in [p // C * C, p]. Rather than teach each backend a new rule, this turns a step's
AttentionMetadata into one that says exactly that, for any backend: decodes get block tables
that start at their chunk's first page (so the native kernel reads only the chunk), prefill
spans a mask over the pages from their earliest query's chunk on. K/V are still written for
every token (slot_mapping is untouched): the paged cache holds the full context for all layers,
and the local layers simply never read outside the current chunk.
"""

from __future__ import annotations

import torch

from edgefire.models.attention.metadata import AttentionMetadata, PrefillSpan


def chunked_local_view(meta: AttentionMetadata, chunk_size: int,
                       block_size: int) -> AttentionMetadata:
    """meta restricted to each query's chunk; computed once per step, shared by local layers."""
    if chunk_size % block_size:
        # A chunk would start inside a page, which a block table cannot express: the decodes
        # become one-token spans with a mask (slower, but any chunk size then works).
        return AttentionMetadata(meta.slot_mapping, 0, meta.decode_block_tables[:0],
                                 meta.decode_context_lens[:0], meta.decode_mask[:, :0],
                                 _decodes_as_spans(meta, chunk_size, block_size)
                                 + [_local_span(s, chunk_size, block_size) for s in meta.prefills])
    tables, lens = _chunk_decode_tables(meta.decode_block_tables, meta.decode_context_lens,
                                        chunk_size, block_size)
    mask = (torch.arange(tables.shape[1] * block_size)[None, :] < lens[:, None])[None, :, None, :]
    return AttentionMetadata(meta.slot_mapping, meta.num_decode_tokens, tables, lens, mask,
                             [_local_span(s, chunk_size, block_size) for s in meta.prefills])


def _chunk_decode_tables(tables: torch.Tensor, lens: torch.Tensor, chunk_size: int,
                         block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Each decode's chunk starts on a page boundary (chunk_size is a multiple of block_size):
    # shift its table to that page and shorten its context to the chunk's tokens.
    first = (lens - 1) // chunk_size * chunk_size // block_size
    new_lens = lens - first * block_size
    num_pages = -(-new_lens // block_size)
    width = int(num_pages.max()) if len(lens) else 0
    cols = torch.arange(width)[None, :]
    picked = tables.gather(1, (first[:, None] + cols).clamp(max=max(tables.shape[1] - 1, 0)))
    return torch.where(cols < num_pages[:, None], picked, 0), new_lens


def _local_span(span: PrefillSpan, chunk_size: int, block_size: int) -> PrefillSpan:
    # The span's queries are the last num_tokens positions of its context; keys are read from
    # the page holding its earliest query's chunk start.
    first_query = span.context_len - span.num_tokens
    first_page = first_query // chunk_size * chunk_size // block_size
    offset = first_page * block_size
    keys = torch.arange(offset, span.context_len)
    queries = torch.arange(first_query, span.context_len)
    starts = queries // chunk_size * chunk_size
    mask = (keys[None, :] >= starts[:, None]) & (keys[None, :] <= queries[:, None])
    if first_query == offset and span.context_len <= offset + chunk_size:
        mask = None  # one chunk from its first key: plain causal, SDPA's fast path
    return PrefillSpan(span.token_start, span.num_tokens, span.context_len - offset,
                       span.block_table[first_page:], mask)


def _decodes_as_spans(meta: AttentionMetadata, chunk_size: int,
                      block_size: int) -> list[PrefillSpan]:
    spans = []
    for row in range(meta.num_decode_tokens):
        context_len = int(meta.decode_context_lens[row])
        table = meta.decode_block_tables[row, :-(-context_len // block_size)]
        spans.append(_local_span(PrefillSpan(row, 1, context_len, table, None),
                                 chunk_size, block_size))
    return spans
