"""The fused Llama step over a model's own weights, and when a step may take it.

A step takes it when every token in it is a decode (one new token per sequence), it has at
most step_rows of them (max_rows() and step_rows() say why), it computes in BF16 over a BF16
KV cache, and no batch-invariant row blocks are asked for (deterministic mode keeps torch's
fixed blocks). With AVX512-BF16 and no AMX, prompt chunks with causal attention take it too,
beside at most step_rows decodes (`takes_prompts`). Anything else runs the torch path, as do
models whose projections are in a form the step cannot read. It reads the tensors the model
holds: BF16 tensors (with AVX512-BF16, over a copy packed as pairs: pack_pairs), and resident
forms that offer `int8_per_channel()` -> (INT8
weight [out, in], BF16 scales [out]), `int4_groupwise()` -> torch's CPU INT4 packing, its
BF16 scales_zeros [groups, out, 2] and the packing's rows per block (or None), or
`row_decoder()` -> a PyCapsule of the codec's own row decoder (row_decoder.h), or None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from edgefire.contract.cpu import has_amx
from edgefire.models.attention import AttentionMetadata
from edgefire.models.native import native_kernel
from edgefire.models.rotary import RotaryEmbedding

fused_kernels = native_kernel("edgefire_fused_decode", Path(__file__).with_name("llama_decode.cpp"))

# The most decode rows the fused step takes. Past a few rows its dot-product matmuls are
# compute-bound (bench/kernels.py), so it gives way where torch's GEMM is much faster: BF16 on
# AMX tiles (oneDNN). The whole step fused against through torch, SmolLM2, two threads (ms a
# step): with AVX512-BF16 and AMX, 8 rows 22.9 vs 35.9, 12 rows 31.6 vs 39.0, 16 rows 41.2 vs
# 42.7, 24 rows 55.0 vs 50.2: MAX_ROWS. Without AMX the fused step wins at every decode size the
# engine makes (MAX_ROWS_WITHOUT_AMX): with AVX512-BF16 (AMD EPYC, Zen 4; torch in BF16) 16
# rows 32.5 vs 73.5, 32 rows 70.2 vs 89.7, 64 rows 99.8 vs 157.2; on AVX2 (torch in float32,
# its fast dtype there) 16 rows 73 vs 170, 32 rows 154 vs 216, 64 rows 254 vs 358 (Zen 3).
# With AVX512-BF16 the BF16 matmuls now take packed pairs (gemm_packed.h), which at 32-64 rows
# run at ~300-400 GFLOP/s where the dot-product kernels ran at ~200 (Zen 4): a 32-row
# SmolLM2 step 55 -> 42 ms.
MAX_ROWS = 12
MAX_ROWS_WITHOUT_AMX = 64
# Past MAX_ROWS on AMX the step still runs as one native call, its BF16 matmuls by oneDNN
# over weights packed once into its layout (projection.h, Proj::torch_mm) and the rest by its
# own loops: what torch's layers add around the GEMMs is Python and dispatch (SmolLM2, two
# threads, 2-core Xeon with AMX, ms a decode step: through torch's layers 16 rows 49.1, 32
# rows 69.6, 64 rows 95.5; this with torch.mm 33.8, 45.7, 68.0; with packed weights 26.6,
# 36.5, 57.9; with the attention prefetch in models/attention/paged_decode.h).
MAX_STEP_ROWS_WITH_AMX = 64
PACKED_FOR_ROWS = 32  # the row count oneDNN's layout is chosen for (any count runs on it)
TORCH_ROW_STEP = 16  # rows go to oneDNN padded to a multiple of this (projection.h)


def max_rows(isa: str) -> int:
    """The most rows the fused step computes with its own kernels (batch-invariant: each row
    the same whatever shares its step), for a kernel built for `isa` on this CPU."""
    if isa == "avx2" or (isa == "avx512bf16" and not has_amx()):
        return MAX_ROWS_WITHOUT_AMX
    return MAX_ROWS


def step_rows(isa: str, all_bf16: bool) -> int:
    """The most decode rows a fused step takes: max_rows, or on AMX with BF16 weights (which
    oneDNN multiplies) MAX_STEP_ROWS_WITH_AMX."""
    own = max_rows(isa)
    return MAX_STEP_ROWS_WITH_AMX if all_bf16 and own == MAX_ROWS and has_amx() else own


class FusedLlamaDecode:
    """A LlamaDecode (llama_decode.cpp) over one model's weights, which it reads in place."""

    def __init__(self, kernel: Any, config: Any, weights: Any, forms: list[list[list[Any]]],
                 torch_gemm_above: int | None = None) -> None:
        """torch_gemm_above: steps of more rows multiply BF16 weights by torch's GEMM
        (default: max_rows, the rows the step's own kernels take)."""
        c = config
        layers = weights.layers
        # Float32 tables: the fused step rotates in float32 (the weights' copy is BF16).
        rotary = RotaryEmbedding(c.head_dim, c.max_position, c.rope_theta)
        self.kernel = kernel
        self.max_rows = max_rows(kernel.isa)
        all_bf16 = all(len(form) == 1 and _is_bf16(form[0])
                       for per_layer in forms for form in per_layer)
        self.step_rows = step_rows(kernel.isa, all_bf16)
        self.lm_head = weight_form(weights.lm_head)
        embed = weight_form(weights.embed)
        above = self.max_rows if torch_gemm_above is None else torch_gemm_above
        past = self.step_rows > above  # some steps multiply through torch's GEMM
        # With AVX512-BF16, BF16 weights are multiplied over a copy packed as pairs
        # (gemm_packed.h) at every row count the step's own kernels take.
        pairs = kernel.isa == "avx512bf16"
        self.step = kernel.LlamaDecode(
            c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.intermediate_size,
            c.rms_norm_eps, embed, [layer.attn_norm for layer in layers],
            [layer.mlp_norm for layer in layers], forms, weights.final_norm,
            rotary.cos.contiguous(), rotary.sin.contiguous(), above,
            _packed(forms) if past and all_bf16 else [],
            [[pack_pairs(form) for form in per_layer] for per_layer in forms] if pairs else [])
        # The LM head past max_rows (torch's GEMM there too), when it is a BF16 tensor.
        self.lm_head_packed = (_reorder(weights.lm_head) if past and _is_bf16(weights.lm_head)
                               else None)
        self.lm_head_pairs = pack_pairs(self.lm_head) if pairs else _NO_PAIRS
        # Prompt chunks too, where the pairs kernel multiplies the weights and torch's GEMM has
        # no AMX: on Zen 4 the pairs kernel matches oneDNN's BF16 GEMM at prompt sizes, and the
        # step saves the ~20% of a prompt chunk torch's path spends around its GEMMs (norms,
        # rotary, SiLU·up, copies) and the Python between them. Causal attention over the pages
        # is paged_prefill.h's, which serves head_dim 64 and 128.
        self.takes_prompts = (pairs and all_bf16 and not has_amx()
                              and c.head_dim in (64, 128))

    @classmethod
    def build(cls, config: Any, weights: Any,
              torch_gemm_above: int | None = None) -> FusedLlamaDecode | None:
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
        return cls(kernel, config, weights, forms, torch_gemm_above)

    def takes(self, num_tokens: int, meta: AttentionMetadata, kv_cache: torch.Tensor,
              dtype: torch.dtype, row_block: int | None) -> bool:
        if row_block is not None or dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16:
            return False
        if not meta.prefills:
            return 0 < num_tokens <= self.step_rows
        # Prompt chunks whose attention is causal (a whole prompt, or a later chunk at its
        # context's end), beside at most step_rows decodes.
        return (self.takes_prompts and meta.num_decode_tokens <= self.step_rows
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
        """Float32 logits of BF16 hidden rows: by the step's own kernel up to max_rows, by
        oneDNN over the packed LM head past them; None where neither takes them."""
        rows = hidden.shape[0]
        if 0 < rows <= self.max_rows:
            if self.lm_head_pairs.numel():
                return self.kernel.linear_packed(hidden.contiguous(), self.lm_head_pairs)
            return self.kernel.linear(hidden.contiguous(), self.lm_head)
        if rows and self.lm_head_packed is not None:
            # padded as Proj::torch_mm pads its rows, for the same reason (projection.h)
            padded = F.pad(hidden, (0, 0, 0, -rows % TORCH_ROW_STEP))
            return torch.ops.mkldnn._linear_pointwise(
                padded, self.lm_head_packed, None, "none", [], "")[:rows].float()
        return None


def _packed(forms: list[list[list[Any]]]) -> list[list[torch.Tensor]]:
    """Each BF16 projection reordered once into oneDNN's blocked layout, for the steps that
    multiply through torch's GEMM (projection.h, Proj::torch_mm). A second copy of those
    weights: where they are BF16 and AMX runs them (SmolLM2: 212 MB, 57 more for the LM head)."""
    return [[_reorder(form[0]) for form in per_layer] for per_layer in forms]


# What a weight the pairs kernel cannot take is packed as: nothing (the step reads it as it is).
_NO_PAIRS = torch.empty(0, dtype=torch.bfloat16)
PAIR_COLS = 64  # output columns a packed block holds (gemm_packed.h's kPackedCols)


def pack_pairs(form: list[Any]) -> torch.Tensor:
    """A BF16 weight [n, k] as gemm_packed.h reads it, [n / 64, k / 2, 64, 2]: each block of 64
    output columns holds, for each pair of K, the 64 columns' two values side by side. A
    second copy of the weight (SmolLM2: 269 MB with the LM head); _NO_PAIRS for other forms
    and shapes."""
    w = form[0] if len(form) == 1 else None
    if not _is_bf16(w) or w.shape[0] % PAIR_COLS or w.shape[1] % 2:
        return _NO_PAIRS
    n, k = w.shape
    return w.view(n // PAIR_COLS, PAIR_COLS, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def _reorder(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, PACKED_FOR_ROWS)


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
