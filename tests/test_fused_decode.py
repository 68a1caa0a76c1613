"""The fused native decode step (models/fused): same K/V and hidden states as the torch path
computed in float32 over the same BF16 weights, within BF16 rounding; the steps it must not
take (prefill, large batches, deterministic row blocks) stay on the torch path."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys

import pytest
import torch

from edgefire.contract.cpu import has_amx
from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.models.fused import (
    MAX_ROWS,
    MAX_ROWS_BESIDE_AMX,
    fused_kernels,
    weight_form,
)
from edgefire.models.fused.llama_decode import form_kind, pack_pairs, pack_panels
from edgefire.models.llama import PROJECTIONS, LlamaConfig, LlamaForCausalLM
from edgefire.plugins.quant.linear import HAS_INT4_KERNEL, Int4Linear, Int8Linear
from edgefire.plugins.unweight.resident import UnweightLinear

CONFIG = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=3,
                     num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                     rms_norm_eps=1e-5, max_position=128)
SEQ_BLOCKS = 13  # _case's blocks a sequence: room for lengths up to 52
BLOCK, BLOCKS = 4, SEQ_BLOCKS * MAX_ROWS_BESIDE_AMX


@pytest.fixture(scope="module")
def kernel():
    built = fused_kernels()
    if built is None or built.isa == "scalar":
        pytest.skip("no vectorized fused kernel on this machine (AVX2 at least)")
    return built


def _weights(c: LlamaConfig = CONFIG) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim

    def rand(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).bfloat16().float()

    out = {"embed": rand(c.vocab_size, c.hidden_size, scale=1.0),
           "final_norm": 1 + rand(c.hidden_size)}
    for i in range(c.num_layers):
        out |= {f"layers.{i}.attn_norm": 1 + rand(c.hidden_size),
                f"layers.{i}.qkv": rand(qkv, c.hidden_size),
                f"layers.{i}.o": rand(c.hidden_size, c.num_heads * c.head_dim),
                f"layers.{i}.mlp_norm": 1 + rand(c.hidden_size),
                f"layers.{i}.gate_up": rand(2 * c.intermediate_size, c.hidden_size),
                f"layers.{i}.down": rand(c.hidden_size, c.intermediate_size)}
    return out


def _decode_meta(tables: list[list[int]], lens: list[int]) -> AttentionMetadata:
    t = torch.tensor(tables)
    n = torch.tensor(lens)
    slots = torch.tensor([tables[s][(m - 1) // BLOCK] * BLOCK + (m - 1) % BLOCK
                          for s, m in enumerate(lens)])
    mask = (torch.arange(t.shape[1] * BLOCK)[None, :] < n[:, None])[None, :, None, :]
    return AttentionMetadata(slots, len(lens), t, n, mask, [])


def _case(rows: int, dtype: torch.dtype, weights: dict[str, torch.Tensor] | None = None,
          config: LlamaConfig = CONFIG):
    """A model in dtype and a cache already holding each sequence's earlier K/V (random),
    about to decode one token per sequence at lengths 3, 7, 9, ... (SEQ_BLOCKS shuffled blocks
    each)."""
    model = LlamaForCausalLM(config, weights or _weights(config), (dtype,),
                             kv_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(model.kv_cache_shape(BLOCKS, BLOCK), generator=g).bfloat16()
    lens = [3 + 3 * s + s % 2 for s in range(rows)]
    tables = [[s * SEQ_BLOCKS + (5 * b) % SEQ_BLOCKS for b in range(SEQ_BLOCKS)]
              for s in range(rows)]
    ids = torch.randint(0, config.vocab_size, (rows,), generator=g)
    positions = torch.tensor([n - 1 for n in lens])
    return model, cache, ids, positions, _decode_meta(tables, lens)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, MAX_ROWS_BESIDE_AMX])
def test_fused_step_matches_float32_torch_path(kernel, rows):
    fused, fused_cache, ids, positions, meta = _case(rows, torch.bfloat16)
    ref, ref_cache, *_ = _case(rows, torch.float32)
    assert fused._fused_step() is not None
    hidden = fused.forward(ids, positions, meta, fused_cache, torch.bfloat16)
    expected = ref.forward(ids, positions, meta, ref_cache, torch.float32)
    assert hidden.dtype == torch.bfloat16
    # BF16 rounding of each projection's input over three layers: a few parts in a hundred.
    torch.testing.assert_close(hidden.float(), expected, atol=0.05, rtol=0.05)
    # K/V are stored in BF16 by both: a value may land one BF16 step apart.
    torch.testing.assert_close(fused_cache.float(), ref_cache.float(), atol=0.1, rtol=0.05)
    # The LM head over the same hidden states: float32 accumulation of the same products.
    torch.testing.assert_close(fused.compute_logits(hidden), ref.compute_logits(hidden.float()),
                               atol=1e-4, rtol=1e-5)


def test_max_rows_past_a_few_only_where_torch_has_no_faster_gemm(monkeypatch):
    import edgefire.models.fused.llama_decode as fused

    monkeypatch.setattr(fused, "has_amx", lambda: True)
    bf16, codec, integer = frozenset({"bf16"}), frozenset({"codec"}), frozenset({"integer"})
    assert fused.max_rows(amx_tiles=True, forms=bf16) == MAX_ROWS
    # Codecs' decoded rows on the step's tiles too (gemm_decoded_amx.h).
    assert fused.max_rows(amx_tiles=True, forms=codec) == MAX_ROWS
    assert fused.max_rows(amx_tiles=True, forms=bf16 | codec) == MAX_ROWS
    # Tiles refused to this process (EDGEFIRE_AMX_TILES=0), or a build without them (another
    # target's, EDGEFIRE_KERNEL_MARCH): dot products, beside torch's AMX, which outruns them
    # past a few rows (codecs' rows decoded to BF16 on torch's path).
    assert fused.max_rows(amx_tiles=False, forms=bf16) == MAX_ROWS_BESIDE_AMX
    assert fused.max_rows(amx_tiles=False, forms=codec) == MAX_ROWS_BESIDE_AMX
    # INT8/INT4 go to torch's weight-only kernels, which use no tiles.
    assert fused.max_rows(amx_tiles=True, forms=integer) == MAX_ROWS
    assert fused.max_rows(amx_tiles=False, forms=integer) == MAX_ROWS
    mixed = bf16 | integer
    assert fused.max_rows(amx_tiles=False, forms=mixed) == MAX_ROWS_BESIDE_AMX
    monkeypatch.setattr(fused, "has_amx", lambda: False)
    assert fused.max_rows(forms=codec) == MAX_ROWS
    assert fused.max_rows(forms=bf16) == MAX_ROWS


def test_form_kind_names_each_weight_form():
    w = torch.randn(64, 64).to(torch.bfloat16)
    assert form_kind(weight_form(w)) == "bf16"
    assert form_kind(weight_form(Int8Linear.quantize(w))) == "integer"
    unweight = UnweightLinear.from_weight(w, tune=False)
    assert form_kind(weight_form(unweight)) == "codec"  # its row decoder's capsule


QUANTIZERS = {
    "int8": Int8Linear.quantize,
    # read in torch's own INT4 CPU packing, which the model keeps for prefill
    "int4": lambda w: Int4Linear.quantize(w, 32, use_kernel=True),
}


def _x_rounding(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """What the INT8 and INT4 kernels' integer paths (x_integers.h) may add to x @ dense.T by
    rounding each x row to 16-bit integers: half its row's step times the weight row's
    absolute sum."""
    step = x.float().abs().amax(1, keepdim=True) / 32767
    return 0.5 * step * dense.abs().sum(1)


def _assert_quantized_product(got: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> None:
    expected = x.float() @ dense.T
    slack = _x_rounding(x, dense) + 1e-4 + 1e-5 * expected.abs()
    assert ((got - expected).abs() <= slack).all(), (got - expected).abs().max()


def _exact(form: str):
    """The quantizer whose dequantize() is exact (torch's INT4 packing dequantizes only through
    its BF16 kernel; the plain packing holds the same integers, scales and zeros)."""
    return (lambda w: Int4Linear.quantize(w, 32, use_kernel=False)) if form == "int4" \
        else QUANTIZERS[form]


@pytest.mark.parametrize("form", list(QUANTIZERS))
def test_fused_step_reads_quantized_projections(kernel, form):
    if form == "int4" and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    fused, cache, ids, positions, meta = _case(3, torch.bfloat16)
    # As the quant codecs load it: the projections in the codec's bits, the tied embedding
    # table (the lm_head) in INT8 rows.
    fused.make_resident(QUANTIZERS[form], form, Int8Linear.quantize)
    assert fused._fused_step() is not None
    assert len(weight_form(fused.params[torch.bfloat16].lm_head)) == 2  # read as INT8 rows
    # The reference multiplies by the dequantized weights, in float32.
    weights = _weights()
    dequantized = {name: (_exact(form)(w).dequantize()
                          if name.rsplit(".", 1)[-1] in PROJECTIONS else w)
                   for name, w in weights.items()}
    dequantized["embed"] = Int8Linear.quantize(weights["embed"]).dequantize()
    ref, ref_cache, *_ = _case(3, torch.float32, dequantized)
    hidden = fused.forward(ids, positions, meta, cache, torch.bfloat16)
    expected = ref.forward(ids, positions, meta, ref_cache, torch.float32)
    torch.testing.assert_close(hidden.float(), expected, atol=0.05, rtol=0.05)
    torch.testing.assert_close(cache.float(), ref_cache.float(), atol=0.1, rtol=0.05)
    # the LM head's INT8 rows, within what rounding x to 16 bits may add
    _assert_quantized_product(fused.compute_logits(hidden), hidden, dequantized["embed"])
    # The torch path (prompt chunks) looks the same rows up.
    fused.fused_decode = False
    torch.testing.assert_close(fused.forward(ids, positions, meta, cache.clone(),
                                             torch.bfloat16).float(),
                               expected, atol=0.05, rtol=0.05)


def test_plain_int4_without_torch_kernel_runs_through_torch(kernel):
    model, cache, ids, positions, meta = _case(2, torch.bfloat16)
    model.make_resident(lambda w: Int4Linear.quantize(w, 32, use_kernel=False), "int4")
    assert model._fused_step() is None
    assert model.forward(ids, positions, meta, cache, torch.bfloat16).shape == (2, 64)


def test_fused_step_reads_unweight_rows_as_dense(kernel):
    # Unweight is lossless: its rows, decoded by the codec's own kernel inside the fused step
    # (embeddings and LM head included), are the dense weights; only the order the products
    # are summed in differs (the codec decodes columns in its own order).
    config = dataclasses.replace(CONFIG, intermediate_size=128)  # rows of 64 columns
    dense, dense_cache, ids, positions, meta = _case(5, torch.bfloat16, config=config)
    packed, packed_cache, *_ = _case(5, torch.bfloat16, config=config)
    to_unweight = functools.partial(UnweightLinear.from_weight, tune=False)
    packed.make_resident(to_unweight, "unweight", to_unweight)
    assert packed._fused_step() is not None
    qkv = packed.params[torch.bfloat16].layers[0].qkv
    assert type(weight_form(qkv)[0]).__name__ == "PyCapsule"  # read packed, not densely
    hidden = packed.forward(ids, positions, meta, packed_cache, torch.bfloat16)
    expected = dense.forward(ids, positions, meta, dense_cache, torch.bfloat16)
    torch.testing.assert_close(hidden, expected, atol=0.02, rtol=0.01)  # a BF16 step at most
    torch.testing.assert_close(packed_cache, dense_cache, atol=0.02, rtol=0.01)
    torch.testing.assert_close(packed.compute_logits(hidden), dense.compute_logits(hidden),
                               atol=1e-4, rtol=1e-5)


def _with_prompt(meta: AttentionMetadata, ids, positions, prompt_len: int):
    """The decode step `meta` plus one new sequence's whole prompt (blocks 150 on) after it."""
    n = meta.num_decode_tokens
    blocks = -(-prompt_len // BLOCK)
    table = torch.arange(150, 150 + blocks)
    slots = torch.tensor([int(table[t // BLOCK]) * BLOCK + t % BLOCK for t in range(prompt_len)])
    span = PrefillSpan(n, prompt_len, prompt_len, table, None)
    mixed = AttentionMetadata(torch.cat([meta.slot_mapping, slots]), n, meta.decode_block_tables,
                              meta.decode_context_lens, meta.decode_mask, [span])
    prompt_ids = torch.randint(0, CONFIG.vocab_size, (prompt_len,),
                               generator=torch.Generator().manual_seed(5))
    return mixed, torch.cat([ids, prompt_ids]), torch.cat([positions, torch.arange(prompt_len)])


def test_decodes_beside_a_prompt_chunk_still_take_the_fused_step(kernel):
    model, cache, ids, positions, meta = _case(3, torch.bfloat16)
    mixed, mixed_ids, mixed_positions = _with_prompt(meta, ids, positions, 6)
    alone_cache, torch_cache = cache.clone(), cache.clone()
    hidden = model.forward(mixed_ids, mixed_positions, mixed, cache, torch.bfloat16)
    # The decode rows are those of the same decodes stepped alone, bit for bit.
    alone = model.forward(ids, positions, meta, alone_cache, torch.bfloat16)
    assert torch.equal(hidden[:3], alone)
    # The whole step against the torch path's: BF16 rounding apart, the same.
    model.fused_decode = False
    expected = model.forward(mixed_ids, mixed_positions, mixed, torch_cache, torch.bfloat16)
    torch.testing.assert_close(hidden.float(), expected.float(), atol=0.05, rtol=0.05)
    torch.testing.assert_close(cache.float(), torch_cache.float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("form", ["bf16", *QUANTIZERS])
def test_prompt_chunks_take_the_fused_step_beside_decodes(kernel, form):
    # Whole prompts and later chunks (causal at their context's end) run in the same native
    # call as the decodes, against torch's path here: BF16 weights over the pairs kernel
    # (AVX-512) or the panels (AVX2), INT8 and INT4 weights over the step's integer kernels
    # (torch's path: its weight-only kernels).
    if form == "int4" and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    config = dataclasses.replace(CONFIG, head_dim=64)
    model, cache, ids, positions, meta = _case(2, torch.bfloat16, config=config)
    if form != "bf16":
        model.make_resident(QUANTIZERS[form], form, Int8Linear.quantize)
    takes = model._fused_step().takes_prompts
    # On an AMX machine torch's path multiplies BF16 rows on tiles, so a build without them
    # (EDGEFIRE_AMX_TILES=0, or another target's) leaves BF16 prompts to it (max_rows).
    beside_amx = form == "bf16" and has_amx() and not kernel.amx
    if kernel.isa in ("avx2", "avx512") and not beside_amx:
        assert takes  # the integer kernels; the panels, or the pairs widened
    elif not takes:
        pytest.skip("BF16 prompt chunks take the fused step on AMX machines only where it has "
                    "the tiles too")
    g = torch.Generator().manual_seed(6)
    spans, slots, new_ids, new_positions = [], [], [], []
    row = meta.num_decode_tokens
    for first, count, start in [(0, 21, 150), (23, 7, 160)]:  # a whole prompt, a later chunk
        context = first + count
        table = torch.arange(start, start + -(-context // BLOCK))
        mask = None if first == 0 else (
            torch.arange(context)[None, :] <= first + torch.arange(count)[:, None])
        spans.append(PrefillSpan(row, count, context, table, mask, mask_is_causal=first > 0))
        slots += [int(table[t // BLOCK]) * BLOCK + t % BLOCK for t in range(first, context)]
        new_ids.append(torch.randint(0, config.vocab_size, (count,), generator=g))
        new_positions.append(torch.arange(first, context))
        row += count
    mixed = AttentionMetadata(torch.cat([meta.slot_mapping, torch.tensor(slots)]),
                              meta.num_decode_tokens, meta.decode_block_tables,
                              meta.decode_context_lens, meta.decode_mask, spans)
    all_ids, all_positions = torch.cat([ids, *new_ids]), torch.cat([positions, *new_positions])
    assert model._fused_step().takes(len(all_ids), mixed, cache, torch.bfloat16, None)
    torch_cache = cache.clone()
    hidden = model.forward(all_ids, all_positions, mixed, cache, torch.bfloat16)
    # Without BF16 dot products (AVX-512 alone) the step widens BF16 weights to float32, while
    # torch's BF16 path there is oneDNN's emulation, which rounds otherwise: both are held to
    # float32's path (here 2 of the K/V values below land up to 0.102 from it; torch's BF16
    # path's, 20, up to 0.14).
    widened = form == "bf16" and kernel.isa != "avx512bf16"
    if widened:
        model = _case(2, torch.float32, config=config)[0]
    elif form != "bf16":
        # Against the dequantized weights in float32: torch's weight-only kernels round each
        # projection's output to BF16 before rotary and the K/V write, which after three
        # layers moves a few K/V values a BF16 step or two from the step's.
        weights = _weights(config)
        dequantized = {name: (_exact(form)(w).dequantize()
                              if name.rsplit(".", 1)[-1] in PROJECTIONS else w)
                       for name, w in weights.items()}
        dequantized["embed"] = Int8Linear.quantize(weights["embed"]).dequantize()
        model = _case(2, torch.float32, dequantized, config=config)[0]
    model.fused_decode = False
    expected = model.forward(all_ids, all_positions, mixed, torch_cache,
                             torch.bfloat16 if form == "bf16" and not widened else torch.float32)
    # Both round each projection's input to BF16; torch's path also its residual stream. Both
    # round Q to BF16 for the prompt attention's dot products (paged_prefill.h), at different
    # points: the fused step's Q is float32 until then, torch's path's comes out of its BF16
    # GEMM and rotary; 4 of these 1,920 values then differ by 0.05-0.11.
    torch.testing.assert_close(hidden.float(), expected.float(), atol=0.15, rtol=0.05)
    # K/V are projections of those hidden states: with x also rounded to 16-bit integers
    # (INT8, INT4), 1-2 of these 638,976 values land up to 0.19 from float32's.
    torch.testing.assert_close(cache.float(), torch_cache.float(),
                               atol=0.1 if form == "bf16" and not widened else 0.2, rtol=0.05)


def test_fused_step_writes_only_the_new_tokens_slots(kernel):
    model, cache, ids, positions, meta = _case(3, torch.bfloat16)
    before = cache.clone()
    model.forward(ids, positions, meta, cache, torch.bfloat16)
    changed = (cache != before).any(dim=-1)  # [layers, 2, kv_heads, blocks, block]
    written = changed.flatten(3).any(dim=(0, 1, 2)).nonzero().flatten()
    assert sorted(written.tolist()) == sorted(meta.slot_mapping.tolist())


def test_linear_matches_a_float_matmul(kernel):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(36, 96, generator=g).bfloat16()
    for rows in range(1, 10):  # whole tiles of four rows and every remainder
        x = torch.randn(rows, 96, generator=g).bfloat16()
        torch.testing.assert_close(kernel.linear(x, [w]), x.float() @ w.float().T,
                                   atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("form", ["bf16", *QUANTIZERS])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(kernel, form):
    # BF16: one or two rows walk the weight's rows in turn, more go side by side (gemv.h);
    # INT8 (gemv_int8.h): 256 columns run in integers (AVX512-BW), 224 (3 lines + 32) widened
    # to float32, one or two rows a weight row's cache line at a time, more a vector, and the
    # last 32 columns by vectors either way; INT4 (gemv_int4.h): x rows go in passes of up to
    # four, in integers where torch packs 64-row blocks (AVX-512). Each row is summed in the
    # same order either way, bit for bit (speculative decoding relies on it).
    if form == "int4" and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    for k in (224, 256):
        _rows_alone_match_rows_together(kernel, form, k)


@pytest.mark.parametrize("n", [48, 36])
def test_codec_rows_products_are_dense_and_do_not_depend_on_the_rows_beside_it(kernel, n):
    # Unweight's rows (lossless) through the codec's row decoder: on AMX tiles where the
    # process has them, 16 decoded weight rows against up to 64 x rows (gemm_decoded_amx.h);
    # else, and for 36 rows (not whole tiles of 16), decoded rows of four in dot products.
    g = torch.Generator().manual_seed(6)
    w = torch.randn(n, 128, generator=g).bfloat16()  # rows of whole 64-column codec blocks
    weight = weight_form(UnweightLinear.from_weight(w, tune=False))
    x = torch.randn(MAX_ROWS, 128, generator=g).bfloat16()
    together = kernel.linear(x, weight)
    torch.testing.assert_close(together, x.float() @ w.float().T, atol=1e-4, rtol=1e-5)
    for start, rows in ((0, 1), (5, 2), (3, 16), (1, 17), (20, 33), (0, MAX_ROWS)):
        alone = kernel.linear(x[start:start + rows].contiguous(), weight)
        assert torch.equal(alone, together[start:start + rows])


# (quantizer, dequantizer) per form and group: torch's INT4 packing dequantizes only through
# its BF16 kernel, so the plain packing (the same integers, scales and zeros) gives the weight.
QUANT_FORMS = {
    "int8": (Int8Linear.quantize, lambda w: Int8Linear.quantize(w).dequantize()),
    **{f"int4-g{g}": (functools.partial(Int4Linear.quantize, group_size=g, use_kernel=True),
                      lambda w, g=g: Int4Linear.quantize(w, g, use_kernel=False).dequantize())
       for g in (32, 64, 128)},
}


@pytest.mark.parametrize("form", list(QUANT_FORMS))
def test_quantized_products_of_many_rows_match_rows_alone(kernel, form):
    # INT8 on AMX machines: x rows from five on go in tiles of 16 rows (gemm_int8_amx.h), the
    # last short, K in steps of 64 values, the weight in blocks of 16 rows. INT4: x rows in
    # passes of up to four (gemv_int4.h), each group's sums scaled in at its end; on AMX
    # machines from 16 rows in tiles of 16 (gemm_int4_amx.h), the last short. K 8448: past
    # the AVX2 INT8 kernel's int32 span (its lanes go into int64 and start again) and where
    # x's integer range is cut (quantize_rows).
    if form.startswith("int4") and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    quantize, dequantize = QUANT_FORMS[form]
    g = torch.Generator().manual_seed(5)
    for n, k in ((64, 256), (128, 4096), (64, 8448)):
        w = torch.randn(n, k, generator=g)
        weight = weight_form(quantize(w))
        x = torch.randn(37, k, generator=g).bfloat16()
        together = kernel.linear(x, weight)
        _assert_quantized_product(together, x, dequantize(w))
        for start, rows in ((0, 1), (3, 4), (5, 5), (0, 16), (14, 17), (1, 33), (0, 37)):
            alone = kernel.linear(x[start:start + rows].contiguous(), weight)
            assert torch.equal(alone, together[start:start + rows])


@pytest.mark.parametrize("form", ["int8", "int4-g32", "int4-g128"])
def test_quantized_products_on_amx_tiles_give_the_dot_products_bits(kernel, form, tmp_path):
    # The same products with the tiles refused to the process (EDGEFIRE_AMX_TILES=0): each
    # total is exact in integers either way (INT4: each group's), then scaled in by the same
    # float operations. INT8 takes tiles from 5 rows (gemm_int8_amx.h), INT4 from 16
    # (gemm_int4_amx.h): 40 rows are two full tiles of x rows and a short one.
    if not kernel.amx:
        pytest.skip("this CPU or this process has no AMX tiles")
    if form.startswith("int4") and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    quantize = "Int8Linear.quantize(w)" if form == "int8" else \
        f"Int4Linear.quantize(w, {form.split('-g')[1]}, use_kernel=True)"
    script = f"""
import sys, torch
from edgefire.models.fused import fused_kernels, weight_form
from edgefire.plugins.quant.linear import Int4Linear, Int8Linear
g = torch.Generator().manual_seed(6)
w = torch.randn(192, 640, generator=g)
q = {quantize}
x = (torch.randn(40, 640, generator=g) * torch.logspace(-3, 3, 40)[:, None]).bfloat16()
x[7] = 0
torch.save(fused_kernels().linear(x, weight_form(q)), sys.argv[1])
"""
    outs = []
    for tiles in ("1", "0"):
        path = tmp_path / f"tiles{tiles}.pt"
        env = {**os.environ, "EDGEFIRE_AMX_TILES": tiles}
        subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True)
        outs.append(torch.load(path))
    assert torch.equal(outs[0], outs[1])
    assert (outs[0][7] == 0).all()


def _rows_alone_match_rows_together(kernel, form: str, k: int) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(128, k, generator=g)
    weight = [w.bfloat16()] if form == "bf16" else weight_form(QUANTIZERS[form](w))
    x = torch.randn(9, k, generator=g).bfloat16()
    if form != "bf16":  # and the product is the dequantized weight's
        _assert_quantized_product(kernel.linear(x, weight), x, _exact(form)(w).dequantize())
    together = kernel.linear(x, weight)
    for start in range(9):
        for rows in range(1, 10 - start):
            alone = kernel.linear(x[start:start + rows].contiguous(), weight)
            assert torch.equal(alone, together[start:start + rows])


@pytest.fixture(scope="module")
def pairs_kernel(kernel):
    if kernel.isa not in ("avx512bf16", "avx512"):
        pytest.skip("the packed-pairs matmul needs AVX-512")
    return kernel


def test_packed_pairs_matmul_matches_a_float_matmul(pairs_kernel):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(192, 160, generator=g).bfloat16()
    # every tile remainder, row chunks of 48 (40 without BF16 dot products)
    for rows in [*range(1, 14), 39, 40, 41, 47, 48, 49, 100]:
        x = torch.randn(rows, 160, generator=g).bfloat16()
        torch.testing.assert_close(pairs_kernel.linear_packed(x, pack_pairs([w])),
                                   x.float() @ w.float().T, atol=1e-4, rtol=1e-5)


def test_time_linears_times_each_weight_and_checks_its_input(kernel):
    # bench/kernels.py's one-call rate: every weight of one shape multiplied in turn, timed.
    g = torch.Generator().manual_seed(6)
    forms = [weight_form(Int8Linear.quantize(torch.randn(64, 128, generator=g)))
             for _ in range(3)]
    x = torch.randn(2, 128, generator=g).bfloat16()
    assert kernel.time_linears(x, forms, []) > 0
    with pytest.raises(RuntimeError, match="pairs for none or each"):
        kernel.time_linears(x, forms, [torch.empty(0)])
    with pytest.raises(RuntimeError, match="int8 \\[rows, cols\\]"):  # a weight of another shape
        kernel.time_linears(x, [*forms, weight_form(Int8Linear.quantize(torch.randn(32, 128)))], [])


def test_a_rows_packed_product_does_not_depend_on_the_rows_beside_it(pairs_kernel):
    # Tiles of six rows, chunks of 48 rows between threads (five and 40 without BF16 dot
    # products): each output is still one chain of products over K in order, bit for bit.
    g = torch.Generator().manual_seed(5)
    pairs = pack_pairs([torch.randn(128, 96, generator=g).bfloat16()])
    x = torch.randn(70, 96, generator=g).bfloat16()
    together = pairs_kernel.linear_packed(x, pairs)
    for start, rows in [(0, 1), (3, 2), (5, 7), (13, 48), (20, 50), (69, 1)]:
        alone = pairs_kernel.linear_packed(x[start:start + rows].contiguous(), pairs)
        assert torch.equal(alone, together[start:start + rows])


def test_only_bf16_and_int8_weights_of_whole_blocks_are_packed_as_pairs():
    assert pack_pairs([torch.zeros(128, 32, dtype=torch.bfloat16)]).shape == (2, 16, 64, 2)
    assert pack_pairs([torch.zeros(96, 32, dtype=torch.bfloat16)]).numel() == 0
    assert pack_pairs([torch.zeros(128, 48, dtype=torch.bfloat16)]).numel() == 0  # K: 32s
    assert pack_pairs([torch.zeros(128, 32)]).numel() == 0  # float32
    int8 = pack_pairs([torch.zeros(128, 64, dtype=torch.int8), torch.ones(128)])
    assert int8.shape == (2, 32, 64, 2) and int8.dtype == torch.int8
    assert pack_pairs([torch.zeros(128, 32, dtype=torch.int8), torch.ones(128)]).numel() == 0
    int4 = [torch.zeros(128, 32, dtype=torch.uint8), torch.ones(2, 128, 2), 64]
    assert pack_pairs(int4).numel() == 0


def test_int8_pairs_give_the_row_major_tiles_bits_at_every_row_count(pairs_kernel):
    # gemm_packed_int8.h sums the same integers as gemv_int8.h's tiles, so a row's output is
    # the same bits whichever kernel its step's row count picks. K of 1152 crosses the
    # int32 lanes' span (512 columns) twice and ends inside a third.
    g = torch.Generator().manual_seed(7)
    form = weight_form(Int8Linear.quantize(torch.randn(192, 1152, generator=g)))
    pairs = pack_pairs(form)
    x = torch.randn(70, 1152, generator=g).bfloat16()
    together = pairs_kernel.linear(x, form, pairs)
    for start, rows in [(0, 1), (3, 2), (5, 3), (8, 4), (12, 7), (20, 48), (69, 1)]:
        part = x[start:start + rows].contiguous()
        assert torch.equal(pairs_kernel.linear(part, form), together[start:start + rows])
        assert torch.equal(pairs_kernel.linear(part, form, pairs), together[start:start + rows])


def test_int8_pairs_sums_at_their_largest_stay_exact(pairs_kernel):
    # As test_int8_sums_at_their_largest_stay_exact, over the packed kernel: 8448 columns is
    # 16.5 spans of int32 lanes, each at the top of its range.
    k = 8448
    weight, scales = weight_form(QUANTIZERS["int8"](-torch.ones(64, k)))
    x = torch.ones(6, k).bfloat16()
    out = pairs_kernel.linear(x, [weight, scales], pack_pairs([weight, scales]))
    exact = (-127 * k * scales.double()).float()
    torch.testing.assert_close(out, exact.expand(6, 64), rtol=1e-6, atol=0)


def test_int8_pairs_reject_a_mismatched_packing(pairs_kernel):
    form = weight_form(Int8Linear.quantize(torch.randn(128, 128)))
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    other = pack_pairs(weight_form(Int8Linear.quantize(torch.randn(64, 128))))
    with pytest.raises(RuntimeError, match="packed INT8 pairs"):
        pairs_kernel.linear(x, form, other)


def test_packed_pairs_reject_a_mismatched_weight(pairs_kernel):
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="packed"):
        pairs_kernel.linear_packed(x, pack_pairs([torch.zeros(64, 32, dtype=torch.bfloat16)]))


@pytest.fixture(scope="module")
def panels_kernel(kernel):
    if kernel.isa != "avx2":
        pytest.skip("the panels matmul is the AVX2 build's (without AVX-512)")
    return kernel


def test_panels_matmul_matches_a_float_matmul(panels_kernel):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(192, 160, generator=g).bfloat16()
    # every tile remainder (tiles of six rows); past a block of rows (256 KiB of float32 x)
    for rows in [*range(1, 14), 47, 100, 409, 410, 500]:
        x = torch.randn(rows, 160, generator=g).bfloat16()
        torch.testing.assert_close(panels_kernel.linear_panels(x, pack_panels([w])),
                                   x.float() @ w.float().T, atol=1e-4, rtol=1e-5)


def test_a_rows_panels_product_does_not_depend_on_the_rows_beside_it(panels_kernel):
    # Tiles of six rows, blocks of 408 rows at K = 160: each output is one chain of FMAs
    # over K in order, bit for bit.
    g = torch.Generator().manual_seed(5)
    panels = pack_panels([torch.randn(64, 160, generator=g).bfloat16()])
    x = torch.randn(450, 160, generator=g).bfloat16()
    together = panels_kernel.linear_panels(x, panels)
    for start, rows in [(0, 1), (3, 2), (5, 7), (13, 48), (20, 420), (449, 1)]:
        alone = panels_kernel.linear_panels(x[start:start + rows].contiguous(), panels)
        assert torch.equal(alone, together[start:start + rows])


def test_only_bf16_weights_of_whole_panels_are_packed():
    assert pack_panels([torch.zeros(32, 64, dtype=torch.bfloat16)]).shape == (2, 64, 16)
    assert pack_panels([torch.zeros(40, 64, dtype=torch.bfloat16)]).numel() == 0
    assert pack_panels([torch.zeros(32, 48, dtype=torch.bfloat16)]).numel() == 0  # K: 32s
    assert pack_panels([torch.zeros(32, 64)]).numel() == 0  # float32
    w = torch.arange(32 * 64, dtype=torch.float32).view(32, 64).bfloat16()
    assert torch.equal(pack_panels([w])[1, 5], w[16:32, 5])  # panel 1, K = 5: 16 columns


def test_packed_panels_reject_a_mismatched_weight(panels_kernel):
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="panels"):
        panels_kernel.linear_panels(x, pack_panels([torch.zeros(64, 32, dtype=torch.bfloat16)]))


def test_the_steps_bf16_rounding_is_torchs_bit_for_bit(kernel):
    # Ties to even, both signs, subnormals, infinities and NaN; then many random magnitudes.
    special = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130, -2 ** -140,
                            float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 3.4e38,
                            -3.4e38, 1e-45, 65504.0, 1 + 2 ** -9, 1 - 2 ** -10])
    g = torch.Generator().manual_seed(4)
    x = torch.cat([special, torch.randn(4096, generator=g) * 10 ** torch.randint(
        -30, 30, (4096,), generator=g).float()])
    rounded = kernel.round_bf16(x)
    expected = x.bfloat16()
    nan = expected.isnan()
    assert torch.equal(rounded.isnan(), nan)
    assert torch.equal(rounded[~nan].view(torch.int16), expected[~nan].view(torch.int16))


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_quantized_linear_matches_the_dequantized_matmul(kernel, form):
    if form == "int4" and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    g = torch.Generator().manual_seed(4)
    w = torch.randn(128, 128, generator=g)  # int4: blocks of 64 rows
    quantized, exact = QUANTIZERS[form](w), _exact(form)(w)
    for rows in range(1, 10):
        x = torch.randn(rows, 128, generator=g).bfloat16()
        _assert_quantized_product(kernel.linear(x, weight_form(quantized)), x,
                                  exact.dequantize())


@pytest.mark.parametrize("k", [4096, 8448])
def test_int8_sums_at_their_largest_stay_exact(kernel, k):
    # Every product at its largest and of one sign: x's integers at the top of their range, the
    # weight at -127. An int32 lane past its range would wrap; the exact sum is k * -127 * the
    # scales, which float32 holds to its rounding.
    weight, scales = weight_form(QUANTIZERS["int8"](-torch.ones(8, k)))
    assert (weight == -127).all()
    x = torch.ones(5, k).bfloat16()
    exact = (-127 * k * scales.double()).float()
    for rows in (1, 5):
        out = kernel.linear(x[:rows].contiguous(), [weight, scales])
        torch.testing.assert_close(out, exact.expand(rows, 8), rtol=1e-6, atol=0)


@pytest.mark.parametrize("form", list(QUANTIZERS))
def test_quantized_rows_of_nan_or_zeros_stay_so(kernel, form):
    # The integer paths scale each x row by its largest value: a NaN must not vanish in the
    # rounding, and an all-zero row has no scale to take.
    if form == "int4" and not HAS_INT4_KERNEL:
        pytest.skip("this torch has no INT4 CPU kernel")
    g = torch.Generator().manual_seed(5)
    weight = weight_form(QUANTIZERS[form](torch.randn(64, 256, generator=g)))
    x = torch.randn(3, 256, generator=g).bfloat16()
    x[0, 7], x[1] = float("nan"), 0
    out = kernel.linear(x, weight)
    assert out[0].isnan().all() and torch.equal(out[1], torch.zeros(64))
    assert out[2].isfinite().all()


@pytest.mark.parametrize("case", ["prefill", "too_many_rows", "row_block", "float32"])
def test_steps_it_must_not_take_stay_on_the_torch_path(kernel, case):
    model, cache, ids, positions, meta = _case(2, torch.bfloat16)
    fused = model._fused_step()
    rows = fused.max_rows + 1 if case == "too_many_rows" else 2
    if case == "prefill":  # a span with a mask of its own (not causal): SDPA's
        meta.prefills = [PrefillSpan(2, 3, 3, torch.arange(1), torch.ones(3, 3, dtype=torch.bool))]
    taken = fused.takes(rows, meta, cache, torch.float32 if case == "float32" else torch.bfloat16,
                        8 if case == "row_block" else None)
    assert not taken


class Dense:
    """A ResidentLinear form the fused step cannot read."""

    def __init__(self, w):
        self.w = w

    def linear(self, x):
        return x @ self.w.T

    def tensors(self):
        return (self.w,)


def test_fused_off_and_unreadable_forms_use_torch(kernel):
    model, cache, ids, positions, meta = _case(2, torch.bfloat16)
    model.fused_decode = False
    assert model._fused_step() is None
    model.fused_decode = True
    assert model._fused_step() is not None

    model.make_resident(Dense, "test")
    assert model._fused_step() is None
    hidden = model.forward(ids, positions, meta, cache, torch.bfloat16)
    assert hidden.shape == (2, CONFIG.hidden_size)
