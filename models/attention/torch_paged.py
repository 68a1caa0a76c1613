"""Paged attention in plain torch (CPU reference and default), via scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgefire.models.attention.cpu_kernels import paged_decode_kernel, paged_prefill_kernel
from edgefire.models.attention.metadata import AttentionMetadata


class TorchPagedAttention:
    """Gathers each sequence's K/V pages from the cache and runs SDPA over them.

    The cache layout [2, kv_heads, blocks, block_size, head_dim] makes a block-table gather
    yield [kv_heads, seqs, tokens, head_dim] without a transpose copy.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 native: bool = True, native_prefill: bool | None = None) -> None:
        # The native kernels read K/V in place; SDPA over gathered pages is the fallback.
        self.kernel = paged_decode_kernel() if native else None
        # Prompts: the native causal kernel by default, on AMX too. There SDPA (oneDNN's BF16
        # attention on AMX tiles) over the gathered pages is faster per call (bench/attention.py,
        # 2-core Xeon: native 0.50-0.94x), but a process taking it for prompts of every length
        # kept growing: from the 100th to the 400th prompt of 20-700 tokens, by 115 MiB
        # against 15 with the native kernel. native_prefill=True/False chooses either way.
        if native_prefill is None:
            native_prefill = native
        prefill = paged_prefill_kernel() if native_prefill else None
        self.prefill_kernel = (prefill if prefill is not None and prefill.vectorized
                               and head_dim in (64, 128) else None)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group = num_heads // num_kv_heads
        self.scale = head_dim**-0.5

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        kvh, num_blocks, block_size, hd = k_cache.shape
        flat = (kvh, num_blocks * block_size, hd)
        # The cache may be stored in a narrower dtype than this step computes in.
        k_cache.view(flat).index_copy_(1, meta.slot_mapping, k.transpose(0, 1).to(k_cache.dtype))
        v_cache.view(flat).index_copy_(1, meta.slot_mapping, v.transpose(0, 1).to(v_cache.dtype))

        out = torch.empty(q.shape[0], self.num_heads * hd, dtype=q.dtype)
        n = meta.num_decode_tokens
        if n:
            out[:n] = self._decode(q[:n], k_cache, v_cache, meta)
        for span in meta.prefills:
            rows = slice(span.token_start, span.token_start + span.num_tokens)
            if self.prefill_kernel is not None and (span.mask is None or span.mask_is_causal):
                o = self.prefill_kernel.paged_prefill(q[rows].float().contiguous(), k_cache,
                                                      v_cache, span.block_table,
                                                      span.context_len, self.scale)
                out[rows] = o.view(span.num_tokens, -1)
                continue
            out[rows] = self._prefill(q[rows], k_cache, v_cache, span.block_table,
                                      span.context_len, span.mask)
        return out

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        # One query per sequence. The KV head is taken as SDPA's batch dim and the sequence as
        # its head dim, so the gathered [kv_heads, seqs, tokens, head_dim] pages are used as
        # they lie (SDPA on CPU is slow on non-contiguous K/V), and the `group` query heads
        # sharing a KV head become that head's queries: GQA without repeating K/V.
        n = q.shape[0]
        tables = meta.decode_block_tables
        if self.kernel is not None:
            o = self.kernel.paged_decode(q.float().contiguous(), k_cache, v_cache, tables,
                                         meta.decode_context_lens, self.scale)
            return o.view(n, -1).to(q.dtype)
        keys = _gather(k_cache, tables).to(q.dtype)
        values = _gather(v_cache, tables).to(q.dtype)
        q = q.view(n, self.num_kv_heads, self.group, self.head_dim).transpose(0, 1)
        o = F.scaled_dot_product_attention(q.contiguous(), keys, values,
                                           attn_mask=meta.decode_mask, scale=self.scale)
        return o.transpose(0, 1).reshape(n, -1)

    def _prefill(self, q, k_cache, v_cache, table, context_len, mask) -> torch.Tensor:
        keys = _gather(k_cache, table[None])[:, :, :context_len].transpose(0, 1)
        values = _gather(v_cache, table[None])[:, :, :context_len].transpose(0, 1)
        q = q.transpose(0, 1)[None]  # [1, heads, tokens, head_dim]
        o = F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, is_causal=mask is None,
            scale=self.scale, enable_gqa=True,
        )
        return o[0].transpose(0, 1).reshape(q.shape[2], -1)


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[kv_heads, blocks, bs, hd] gathered by [seqs, max_blocks] -> [kv_heads, seqs, tokens, hd]."""
    kvh, _, block_size, hd = cache.shape
    seqs, max_blocks = tables.shape
    # index_select, not cache[:, tables]: advanced indexing on an inner dim takes a slow path
    # whose cost grows with the whole cache, not with the blocks read.
    picked = cache.index_select(1, tables.reshape(-1))
    return picked.view(kvh, seqs, max_blocks * block_size, hd)
