"""Paged attention: the native decode and prefill kernels and the SDPA path agree with dense
attention."""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.nn.functional as F

from edgefire.models.attention import (
    AttentionMetadata,
    PrefillSpan,
    TorchPagedAttention,
)
from edgefire.models.attention.cpu_kernels import paged_decode_kernel, paged_prefill_kernel

HEADS, KV_HEADS, HEAD_DIM, BLOCKS, BLOCK = 6, 2, 32, 24, 4


def _dense(q, keys, values):
    """Reference: one query [heads, hd] over keys/values [kv_heads, len, hd]."""
    out = F.scaled_dot_product_attention(q[None, :, None], keys[None], values[None],
                                         enable_gqa=True)
    return out[0, :, 0]


def _dense_bf16_products(q, keys, values):
    """What the kernels compute over a BF16 cache with AVX512-BF16 (paged_decode.h): Q times
    the scale and the softmax's unnormalised weights rounded to BF16 for the products, the
    rest float32."""
    group = q.shape[0] // keys.shape[0]
    k, v = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
    scores = torch.einsum("hd,hld->hl", (q * q.shape[-1] ** -0.5).bfloat16().float(), k)
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.einsum("hl,hld->hd", p.bfloat16().float(), v) / p.sum(-1, keepdim=True)


def _decode_case(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, KV_HEADS, BLOCKS, BLOCK, HEAD_DIM, generator=g).to(dtype)
    lens = torch.tensor([1, 5, 12, 17])
    tables = torch.stack([torch.randperm(BLOCKS, generator=g)[:5] for _ in lens])
    q = torch.randn(len(lens), HEADS, HEAD_DIM, generator=g)
    return cache, lens, tables, q


def _reference(cache, lens, tables, q):
    rows = []
    for s, n in enumerate(lens.tolist()):
        kv = cache[:, :, tables[s]].reshape(2, KV_HEADS, -1, HEAD_DIM)[:, :, :n].float()
        rows.append(_dense(q[s], kv[0], kv[1]))
    return torch.stack(rows)


def _decode_meta(lens, tables):
    width = tables.shape[1] * BLOCK
    mask = (torch.arange(width)[None, :] < lens[:, None])[None, :, None, :]
    return AttentionMetadata(torch.zeros(0, dtype=torch.long), len(lens), tables, lens, mask, [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_kernel_matches_dense(dtype):
    kernel = paged_decode_kernel()
    if kernel is None:
        pytest.skip("no C++ compiler for the native kernel")
    cache, lens, tables, q = _decode_case(dtype)
    out = kernel.paged_decode(q, cache[0].contiguous(), cache[1].contiguous(), tables, lens,
                              HEAD_DIM**-0.5)
    torch.testing.assert_close(out, _reference(cache, lens, tables, q), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "group"), [(64, 1), (64, 3), (64, 8), (128, 2), (64, 9)])
def test_native_decode_kernel_register_tiled_shapes(dtype, head_dim, group):
    # head_dim 64/128 with up to 8 queries per KV head take the register-tiled task (group 9
    # the generic loop); lengths cross its 4-key and 16-key tiles and the 16-token blocks.
    kernel = paged_decode_kernel()
    if kernel is None:
        pytest.skip("no C++ compiler for the native kernel")
    g = torch.Generator().manual_seed(head_dim + group)
    kv_heads, block, blocks = 2, 16, 12
    cache = torch.randn(2, kv_heads, blocks, block, head_dim, generator=g).to(dtype)
    lens = torch.tensor([1, 3, 16, 17, 34, 61])
    tables = torch.stack([torch.randperm(blocks, generator=g)[:4] for _ in lens])
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=g)
    out = kernel.paged_decode(q, cache[0].contiguous(), cache[1].contiguous(), tables, lens,
                              head_dim**-0.5)
    # With AVX512-BF16 a BF16 cache's products in the register-tiled task are BF16 dot
    # products: against dense attention with the same roundings, and within what they cost.
    pairs = dtype == torch.bfloat16 and kernel.bf16_pairs and group <= 8
    for s, n in enumerate(lens.tolist()):
        kv = cache[:, :, tables[s]].reshape(2, kv_heads, -1, head_dim)[:, :, :n].float()
        expected = _dense(q[s], kv[0], kv[1])
        if not pairs:
            torch.testing.assert_close(out[s], expected, atol=1e-5, rtol=1e-4)
            continue
        torch.testing.assert_close(out[s], _dense_bf16_products(q[s], kv[0], kv[1]),
                                   atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out[s], expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("native", [True, False])
def test_backend_decode_paths_agree(native):
    cache, lens, tables, q = _decode_case(torch.float32, seed=1)
    backend = TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, native=native)
    # Decoding writes the new token's K/V first; write what is already there so the cache
    # (and so the reference) is unchanged.
    slots = torch.stack([tables[s, (n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK
                         for s, n in enumerate(lens.tolist())])
    flat = cache.view(2, KV_HEADS, -1, HEAD_DIM)
    k_new, v_new = flat[0, :, slots].transpose(0, 1), flat[1, :, slots].transpose(0, 1)
    meta = _decode_meta(lens, tables)
    meta.slot_mapping = slots
    out = backend.forward(q, k_new.clone(), v_new.clone(), cache, meta)
    expected = _reference(cache, lens, tables, q).reshape(len(lens), -1)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_prefill_chunk_after_cached_prefix_is_causal():
    g = torch.Generator().manual_seed(2)
    cache = torch.zeros(2, KV_HEADS, BLOCKS, BLOCK, HEAD_DIM)
    total, chunk = 10, 4  # 6 tokens already cached, 4 computed now
    k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=g)
    table = torch.tensor([7, 3, 11])
    slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total)])
    cache.view(2, KV_HEADS, -1, HEAD_DIM)[0, :, slots[:6]] = k[:6].transpose(0, 1)
    cache.view(2, KV_HEADS, -1, HEAD_DIM)[1, :, slots[:6]] = v[:6].transpose(0, 1)
    mask = torch.arange(total)[None, :] <= torch.arange(total - chunk, total)[:, None]
    meta = AttentionMetadata(slots[6:], 0, torch.zeros(0, 1, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), torch.zeros(1, 0, 1, 0).bool(),
                             [PrefillSpan(0, chunk, total, table, mask)])
    backend = TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, native=False)
    out = backend.forward(q[6:], k[6:], v[6:], cache, meta)
    full = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          v.transpose(0, 1)[None], is_causal=True,
                                          enable_gqa=True)
    torch.testing.assert_close(out, full[0].transpose(0, 1)[6:].reshape(chunk, -1),
                               atol=1e-5, rtol=1e-4)


def _prefill_kernel():
    kernel = paged_prefill_kernel()
    if kernel is None or not kernel.vectorized:
        pytest.skip("the native prefill kernel needs a C++ compiler and AVX2 or AVX-512")
    return kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("head_dim", "group"), [(64, 3), (64, 1), (128, 4), (64, 5)])
@pytest.mark.parametrize(("chunk", "context"), [(1, 1), (7, 7), (16, 16), (33, 33), (70, 70),
                                                (20, 90), (1, 65), (64, 130)])
def test_native_prefill_kernel_matches_dense_causal(dtype, head_dim, group, chunk, context):
    # Lengths cross the kernel's 16-query blocks and its 64-key (AVX-512) or 16-key (AVX2)
    # tiles; a chunk shorter than its context is a later prompt chunk or a prefix-cache hit.
    kernel = _prefill_kernel()
    g = torch.Generator().manual_seed(head_dim * group + chunk + context)
    kv_heads, block, blocks = 2, 16, 20
    cache = torch.randn(2, kv_heads, blocks, block, head_dim, generator=g).to(dtype)
    table = torch.randperm(blocks, generator=g)[:-(-context // block)]
    q = torch.randn(chunk, kv_heads * group, head_dim, generator=g)
    out = kernel.paged_prefill(q, cache[0].contiguous(), cache[1].contiguous(), table, context,
                               head_dim**-0.5)
    kv = cache[:, :, table].reshape(2, kv_heads, -1, head_dim)[:, :, :context].float()
    mask = torch.arange(context)[None, :] <= torch.arange(context - chunk, context)[:, None]
    expected = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kv[0][None], kv[1][None],
                                              attn_mask=mask, enable_gqa=True)
    # With AVX512-BF16 a BF16 cache's products run in BF16 dot products, Q and the softmax's
    # weights rounded to BF16 for them (8 bits of mantissa: ~4e-3 of an output of O(1) here,
    # 6.5e-3 at most over these cases); otherwise in float32 FMAs.
    bf16 = dtype == torch.bfloat16 and kernel.bf16_pairs
    torch.testing.assert_close(out, expected[0].transpose(0, 1), atol=1e-2 if bf16 else 1e-5,
                               rtol=1e-2 if bf16 else 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_native_prefill_chunks_in_one_call_match_each_alone(dtype, threads):
    # A step's chunks share one call (the fused step's prompt attention): its tasks go to
    # whichever thread is free, longest first, so which thread computes a chunk's rows depends
    # on the chunks beside it; its output must not. Bit for bit, the same as each alone.
    kernel = _prefill_kernel()
    g = torch.Generator().manual_seed(11)
    heads, kv_heads, head_dim, block, blocks = 6, 2, 64, 16, 40
    cache = torch.randn(2, kv_heads, blocks, block, head_dim, generator=g).to(dtype)
    chunks = [(70, 70), (5, 5), (33, 130), (1, 64), (200, 200)]  # (queries, context)
    pages = torch.randperm(blocks, generator=g)
    tables, at = [], 0
    for _, context in chunks:
        tables.append(pages[at:at + -(-context // block)])
        at = (at + 3) % 20  # chunks' tables overlap: prompts sharing cached pages
    qs = [torch.randn(n, heads, head_dim, generator=g) for n, _ in chunks]
    contexts = [context for _, context in chunks]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = kernel.paged_prefill_chunks(qs, cache[0], cache[1], tables, contexts, 0.125)
        # Past the tile budget a step's chunks go in groups (here of one to three chunks; one
        # chunk alone past the budget in float32).
        grouped = kernel.paged_prefill_chunks(qs, cache[0], cache[1], tables, contexts, 0.125,
                                              tile_bytes=200 * kv_heads * head_dim * 8)
        alone = [kernel.paged_prefill(q, cache[0], cache[1], t, c, 0.125)
                 for q, t, c in zip(qs, tables, contexts, strict=True)]
    finally:
        torch.set_num_threads(previous)
    assert len(together) == len(grouped) == len(chunks)
    for got, in_groups, expected in zip(together, grouped, alone, strict=True):
        assert torch.equal(got, expected)
        assert torch.equal(in_groups, expected)
    with pytest.raises(RuntimeError, match="a block table and a context length"):
        kernel.paged_prefill_chunks(qs, cache[0], cache[1], tables[:2], contexts, 0.125)


def test_native_prefill_keeps_no_tiles_past_its_budget():
    # 32 chunks over one cached 4,000-token prefix (prompts sharing a system prompt) lay out
    # every chunk's key tiles: 94 MiB in BF16 at SmolLM2's 3 KV heads of 64, 188 in float32.
    # In groups within the 16 MiB budget, neither the call nor what it keeps after grows so.
    kernel = _prefill_kernel()
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, block, context = 9, 3, 64, 16, 4016
    blocks = -(-context // block)
    cache = torch.randn(2, kv_heads, blocks, block, head_dim, generator=g).to(torch.bfloat16)
    table = torch.arange(blocks)
    qs = [torch.randn(16, heads, head_dim, generator=g) for _ in range(32)]
    process = psutil.Process()
    before = process.memory_info().rss / (1 << 20)
    outs = kernel.paged_prefill_chunks(qs, cache[0], cache[1], [table] * 32, [context] * 32,
                                       0.125)
    assert process.memory_info().rss / (1 << 20) - before < 40
    alone = kernel.paged_prefill(qs[7], cache[0], cache[1], table, context, 0.125)
    assert torch.equal(outs[7], alone)


def test_native_prefill_kernel_rejects_bad_tables():
    kernel = _prefill_kernel()
    cache = torch.zeros(2, 1, 4, 16, 64)  # one KV head, 4 blocks of 16
    q = torch.zeros(8, 2, 64)
    with pytest.raises(RuntimeError, match="out of range"):
        kernel.paged_prefill(q, cache[0], cache[1], torch.tensor([0, 9]), 20, 0.125)
    with pytest.raises(RuntimeError, match="table"):
        kernel.paged_prefill(q, cache[0], cache[1], torch.tensor([0]), 20, 0.125)


@pytest.mark.parametrize("native", [True, False])
def test_backend_prefill_paths_agree(native):
    # Two prompts in one step, the second a later chunk of its sequence: the backend's native
    # kernel (head_dim 64) and SDPA over gathered pages give dense causal attention's output.
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, head_dim, block, blocks = 6, 2, 64, 16, 16
    cache = torch.zeros(2, kv_heads, blocks, block, head_dim)
    lengths, cached = (21, 40), (0, 25)
    tables = [torch.tensor([3, 8]), torch.tensor([5, 0, 12])]
    ks = [torch.randn(n, kv_heads, head_dim, generator=g) for n in lengths]
    vs = [torch.randn(n, kv_heads, head_dim, generator=g) for n in lengths]
    qs = [torch.randn(n, heads, head_dim, generator=g) for n in lengths]
    slots = [torch.tensor([t[p // block] * block + p % block for p in range(n)])
             for t, n in zip(tables, lengths, strict=True)]
    flat = cache.view(2, kv_heads, -1, head_dim)
    for s, c in zip(range(2), cached, strict=True):  # what earlier steps cached
        flat[0, :, slots[s][:c]] = ks[s][:c].transpose(0, 1)
        flat[1, :, slots[s][:c]] = vs[s][:c].transpose(0, 1)
    spans, rows = [], 0
    for s, (n, c) in enumerate(zip(lengths, cached, strict=True)):
        keys, queries = torch.arange(n), torch.arange(c, n)
        mask = (keys[None, :] <= queries[:, None]) if c else None
        spans.append(PrefillSpan(rows, n - c, n, tables[s], mask, mask_is_causal=True))
        rows += n - c
    meta = AttentionMetadata(torch.cat([sl[c:] for sl, c in zip(slots, cached, strict=True)]), 0,
                             torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                             torch.zeros(1, 0, 1, 0).bool(), spans)
    backend = TorchPagedAttention(heads, kv_heads, head_dim, native=native, native_prefill=native)
    if native:
        assert backend.prefill_kernel is not None or paged_prefill_kernel() is None
    out = backend.forward(torch.cat([q[c:] for q, c in zip(qs, cached, strict=True)]),
                          torch.cat([k[c:] for k, c in zip(ks, cached, strict=True)]),
                          torch.cat([v[c:] for v, c in zip(vs, cached, strict=True)]),
                          cache, meta)
    expected = [F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, enable_gqa=True)[0].transpose(0, 1)[c:].reshape(len(q) - c, -1)
        for q, k, v, c in zip(qs, ks, vs, cached, strict=True)]
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-4)


def test_prompts_take_the_native_kernel_by_default():
    # On AMX too: SDPA is faster per call there, but its buffers per prompt length kept a
    # node's memory growing (torch_paged.py says how much); it stays one argument away.
    _prefill_kernel()
    assert TorchPagedAttention(9, 3, 64).prefill_kernel is not None  # head_dim 64 and 128
    assert TorchPagedAttention(9, 3, 64, native_prefill=False).prefill_kernel is None
    backend = TorchPagedAttention(9, 3, 64, native_prefill=False)
    assert backend.kernel is not None  # decode keeps its native kernel either way
