"""The fused Llama step over a model's own weights, and when a step may take it.

A step takes it when every token in it is a decode (one new token per sequence), it has at
most max_rows of them (max_rows() says why), it computes in BF16 over a BF16
KV cache, and no batch-invariant row blocks are asked for (deterministic mode keeps torch's
fixed blocks). Prompt chunks with causal attention take it too, beside at most max_rows
decodes, where the weights are BF16, INT8 or INT4 (`takes_prompts`; with AVX-512 on AMX tiles
where torch has them too). Anything else runs the torch path, as do models whose projections
are in a form the step cannot read. It reads the tensors the model holds: BF16 tensors (with
AVX-512, over a copy packed as pairs: pack_pairs; on AVX2, prompt rows over a copy packed in
panels: pack_panels), and resident forms that offer `int8_per_channel()` -> (INT8 weight [out, in],
BF16 scales [out]), `int4_groupwise()` -> torch's CPU INT4 packing, its
BF16 scales_zeros [groups, out, 2] and the packing's rows per block (or None), or
`row_decoder()` -> a PyCapsule of the codec's own row decoder (row_decoder.h), or None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgefire.contract.cpu import has_amx
from edgefire.models.attention import AttentionMetadata
from edgefire.models.native import native_kernel
from edgefire.models.rotary import RotaryEmbedding

fused_kernels = native_kernel("edgefire_fused_decode", Path(__file__).with_name("llama_decode.cpp"))

# The most decode rows the fused step takes (bench/steps.py times each form's crossover on a
# machine). Past a few rows its dot-product kernels are compute-bound (bench/kernels.py); whether
# they still beat torch's path there depends on what that path does with the weight. BF16 weights
# and codecs' rows (decoded to BF16) go to oneDNN's GEMM, which runs on AMX tiles where the CPU
# has them: there the step gives way past MAX_ROWS_BESIDE_AMX unless it has the tiles too (codecs'
# decoded rows on tiles: gemm_decoded_amx.h, whose comment has their figures). BF16
# weights multiply over packed pairs (gemm_packed.h), on AMX tiles where the process may use them
# (gemm_amx.h), and take MAX_ROWS: on a 2-core Xeon with AMX, ms a step at 1, 4, 8, 16, 32 and 64
# rows, 15.1, 17.5, 19.9, 25.5, 30.3 and 54.6 on tiles, against 13.9, 16.5, 23.5, 31.4, 44.2 and
# 57.9 with AVX512-BF16 dot products up to 12 rows and oneDNN's GEMM past them. Without the tiles
# (EDGEFIRE_AMX_TILES=0), ms a SmolLM2 step fused against through torch on that Xeon, 12 rows 30.3
# vs 47.6, 16 rows 42.8 vs 47.9, 20 rows 50.0 vs 55.5, 24 rows 60.9 vs 60.3; the Unweight codec's
# row decoders, 12 rows 44.1 vs 69.3, 16 rows 61.1 vs 76.7, 20 rows 69.8 vs 81.9, 24 rows 81.3 vs
# 79.2. INT8 and INT4 weights go to torch's weight-only kernels, which use no tiles, and the
# step's integer kernels beat them at every row count there: same Xeon, ms a step at 1, 16, 32 and
# 64 rows, INT8 (gemv_int8.h, on AMX tiles from 5 rows: gemm_int8_amx.h) 6.1, 18.2, 30.5, 55.3 vs
# 33.3, 82.7, 138.9, 264.8 through torch; INT4 (gemv_int4.h) 3.9, 26.3, 46.3, 84.7 vs 18.0, 65.8,
# 118.4, 209.3. Without AMX the step wins at every decode size the engine makes: with AVX512-BF16
# (AMD EPYC, Zen 4; torch in BF16) 16 rows 32.5 vs 73.5, 32 rows 70.2 vs 89.7, 64 rows 99.8 vs
# 157.2; on AVX2 (torch in float32, its fast dtype there) 16 rows 73 vs 170, 32 rows 154 vs 216,
# 64 rows 254 vs 358 (Zen 3); with AVX-512 alone (Ice Lake, 2 cores; pairs widened to float32,
# gemm_packed.h) 1 row 16.1 vs 38.6, 16 rows 31.7 vs 140.8, 64 rows 122.2 vs 196.4 (torch in
# float32; in BF16, oneDNN's emulation, 417.4: bench/results/steps-avx512.json).
MAX_ROWS = 64
MAX_ROWS_BESIDE_AMX = 16


def max_rows(amx_tiles: bool = False, forms: frozenset[str] = frozenset()) -> int:
    """The most rows the fused step computes (batch-invariant: each row the same whatever
    shares its step), for a kernel on this CPU that may (`amx_tiles`) use AMX tiles, over
    weights of these forms (form_kind's names). Whatever the kernel was built for: a build for
    another target (EDGEFIRE_KERNEL_MARCH) on an AMX machine has torch's AMX GEMM beside it."""
    if not has_amx():
        return MAX_ROWS
    beside_onednn = ("codec" in forms or "bf16" in forms) and not amx_tiles
    return MAX_ROWS_BESIDE_AMX if beside_onednn else MAX_ROWS


def form_kind(form: list[Any]) -> str:
    """What kind of weight a form (weight_form) is, for max_rows: bf16, codec or integer."""
    if len(form) > 1:
        return "integer"  # INT8 (weight, scales) or INT4 (packed, scales_zeros, block)
    return "bf16" if _is_bf16(form[0]) else "codec"


class FusedLlamaDecode:
    """A LlamaDecode (llama_decode.cpp) over one model's weights, which it reads in place."""

    def __init__(self, kernel: Any, config: Any, weights: Any,
                 forms: list[list[list[Any]]]) -> None:
        c = config
        layers = weights.layers
        # Float32 tables: the fused step rotates in float32 (the weights' copy is BF16).
        rotary = RotaryEmbedding(c.head_dim, c.max_position, c.rope_theta)
        self.kernel = kernel
        kinds = frozenset(form_kind(form) for per_layer in forms for form in per_layer)
        self.max_rows = max_rows(kernel.amx, kinds)
        self.lm_head = weight_form(weights.lm_head)
        embed = weight_form(weights.embed)
        # With AVX-512, BF16 weights are multiplied over a copy packed as pairs (gemm_packed.h:
        # BF16 dot products, or without them the pairs widened to float32) at every row count
        # the step's own kernels take, and INT8 weights over such a copy from two rows
        # (gemm_packed_int8.h: 16-bit integer dot products, the row-major tiles' integers).
        pairs = kernel.isa in ("avx512bf16", "avx512")
        # On AVX2 the decode rows stay on gemv.h's tiles (they read the BF16 weight, half
        # float32's bytes, at one row) and a step's prompt rows multiply over panels
        # (gemm_panels.h), at ~1.4x the tiles' rate.
        pack = pack_pairs if pairs else pack_panels if kernel.isa == "avx2" else None
        self.step = kernel.LlamaDecode(
            c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.intermediate_size,
            c.rms_norm_eps, embed, [layer.attn_norm for layer in layers],
            [layer.mlp_norm for layer in layers], forms, weights.final_norm,
            rotary.cos.contiguous(), rotary.sin.contiguous(),
            [[pack(form) for form in per_layer] for per_layer in forms] if pack else [])
        self.lm_head_pairs = pack_pairs(self.lm_head) if pairs else _UNPACKED
        # Prompt chunks too, where the step multiplies the weights as fast as torch's path: on
        # Zen 4 the pairs kernel matches oneDNN's BF16 GEMM at prompt sizes, as it does on AMX
        # tiles where both have them (gemm_amx.h), and the step saves the ~20% of a prompt
        # chunk torch's path spends around its GEMMs (norms, rotary, SiLU·up, copies) and the
        # Python between them. INT8 and INT4 prompts on torch's path go to its weight-only
        # kernels, which the step's integer kernels outrun at every size: 2-core Xeon, a
        # 385-token SmolLM2 prompt, tok/s through the step against torch's, INT8 1,893-2,316
        # vs 365-424 (on AMX tiles, gemm_int8_amx.h) and 557-604 vs 361-400 with the tiles
        # refused, INT4 486-797 vs 271-274; on Zen 4 the integer kernels multiply 1.4-2.8x as
        # fast as torch's at 64 rows (bench/results/kernels.json). With AVX-512 alone (Ice
        # Lake, 2 cores) the widened pairs run a 385-token BF16 prompt at 756 tok/s against
        # torch's float32 path's 702, INT8 652 vs 400, INT4 800 vs 521 (steps-avx512.json).
        # Codecs' rows are left to torch's GEMM over the decoded rows. Causal attention over
        # the pages is paged_prefill.h's, which serves head_dim 64 and 128. On AVX2 (no BF16
        # dot products) INT8 and INT4 prompts take the step's integer kernels (vpmaddwd): Zen 3,
        # 2 cores, the 385-token prompt, tok/s through the step against torch's path in BF16
        # (float32 is no faster there), INT8 668-680 vs 375-378, INT4 557-567 vs 326-342; BF16
        # prompts multiply over panels (gemm_panels.h), where gemv.h's tiles only matched torch's
        # float32 path (Zen 4 with AVX-512 hidden, 2 cores, 32 prompts of 64-512 tokens: 394
        # tok/s either way).
        self.takes_prompts = pack is not None and kinds <= {"bf16", "integer"} \
            and self.max_rows == MAX_ROWS and c.head_dim in (64, 128)

    @classmethod
    def build(cls, config: Any, weights: Any) -> FusedLlamaDecode | None:
        """The fused step for these weights, or None when they or the CPU cannot take it."""
        kernel = fused_kernels()
        if kernel is None or kernel.isa == "scalar":
            return None  # without vector units (AVX2 at least) torch's matmul is as fast
        norms = [weights.final_norm,
                 *(t for layer in weights.layers for t in (layer.attn_norm, layer.mlp_norm))]
        if not all(_is_bf16(t) for t in norms):
            return None
        forms = [[weight_form(getattr(layer, name)) for layer in weights.layers]
                 for name in ("qkv", "o", "gate_up", "down")]
        tables = [weight_form(weights.embed), weight_form(weights.lm_head)]
        if any(form is None for per_layer in [*forms, tables] for form in per_layer):
            return None  # a form it cannot read: its own kernels, via torch
        if (config.hidden_size % 32 or config.intermediate_size % 32 or config.head_dim % 16
                or weights.lm_head.shape[0] % 4):
            return None
        return cls(kernel, config, weights, forms)

    def takes(self, num_tokens: int, meta: AttentionMetadata, kv_cache: torch.Tensor,
              dtype: torch.dtype, row_block: int | None) -> bool:
        if row_block is not None or dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16:
            return False
        if not meta.prefills:
            return 0 < num_tokens <= self.max_rows
        # Prompt chunks whose attention is causal (a whole prompt, or a later chunk at its
        # context's end), beside at most max_rows decodes.
        return (self.takes_prompts and meta.num_decode_tokens <= self.max_rows
                and all(span.mask is None or span.mask_is_causal for span in meta.prefills))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        spans = meta.prefills
        assert all(span.token_start == meta.num_decode_tokens
                   + sum(s.num_tokens for s in spans[:i]) for i, span in enumerate(spans))
        tables = (meta.decode_block_tables if meta.num_decode_tokens
                  else torch.zeros((0, 1), dtype=torch.int64))
        return self.step.forward(
            input_ids, positions, meta.slot_mapping, tables,
            meta.decode_context_lens[:meta.num_decode_tokens], kv_cache,
            [span.num_tokens for span in spans],
            [span.context_len for span in spans],
            [span.block_table.contiguous() for span in spans])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Float32 logits of BF16 hidden rows by the step's own kernel, up to max_rows; None past
        them."""
        rows = hidden.shape[0]
        if 0 < rows <= self.max_rows:
            return self.kernel.linear(hidden.contiguous(), self.lm_head, self.lm_head_pairs)
        return None


# What a weight the packing cannot take is packed as: nothing (the step reads it as it is).
_UNPACKED = torch.empty(0, dtype=torch.bfloat16)
PAIR_COLS = 64  # output columns a packed block holds (gemm_packed.h's kPackedCols)


def pack_pairs(form: list[Any]) -> torch.Tensor:
    """A BF16 weight [n, k] as gemm_packed.h reads it, or an INT8 one (weight, scales) as
    gemm_packed_int8.h does, [n / 64, k / 2, 64, 2]: each block of 64 output columns holds,
    for each pair of K, the 64 columns' two values side by side. A second copy of the weight
    (SmolLM2: 269 MB with the LM head in BF16); _UNPACKED for other forms and shapes (K in
    whole 32-value chunks, as the step's kernels take it: without BF16 dot products the
    kernel widens x a vector at a time; INT8 in whole 64-value lines, as its integer tiles)."""
    w = form[0] if len(form) <= 2 else None
    bf16 = len(form) == 1 and _is_bf16(w)
    int8 = len(form) == 2 and isinstance(w, torch.Tensor) and w.dtype == torch.int8
    if not (bf16 or int8) or w.shape[0] % PAIR_COLS or w.shape[1] % (32 if bf16 else 64):
        return _UNPACKED
    n, k = w.shape
    return w.view(n // PAIR_COLS, PAIR_COLS, k // 2, 2).permute(0, 2, 1, 3).contiguous()


PANEL_COLS = 16  # output columns a panel holds (gemm_panels.h's kPanelCols)


def pack_panels(form: list[Any]) -> torch.Tensor:
    """A BF16 weight [n, k] as gemm_panels.h reads it, [n / 16, k, 16]: each panel of 16 output
    columns holds, for each K, the 16 columns' values side by side. A second copy of the
    weight, as pack_pairs's; _UNPACKED for other forms and shapes."""
    w = form[0] if len(form) == 1 else None
    if not _is_bf16(w) or w.shape[0] % PANEL_COLS or w.shape[1] % 32:
        return _UNPACKED
    n, k = w.shape
    return w.view(n // PANEL_COLS, PANEL_COLS, k).transpose(1, 2).contiguous()


def _is_bf16(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16


def weight_form(projection: object) -> list[Any] | None:
    """What the kernel reads a weight from (projection.h's Proj), or None: its tensors, or
    the capsule of a codec's row decoder (row_decoder.h)."""
    if _is_bf16(projection):
        return [projection]
    if (decoder := getattr(projection, "row_decoder", None)) is not None:
        capsule = decoder()
        return None if capsule is None else [capsule]
    if (int8 := getattr(projection, "int8_per_channel", None)) is not None:
        return list(int8())
    if (int4 := getattr(projection, "int4_groupwise", None)) is not None:
        packed = int4()
        # torch's packing goes by blocks of output rows (gemv_int4.h)
        return None if packed is None or packed[0].shape[0] % packed[2] else list(packed)
    return None
