"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) over a paged cache of latents.

Per token the cache keeps only what MLA needs to rebuild every head's key and value: the
compressed KV latent c (kv_lora_rank, RMS-normed) and the one RoPE key shared by all heads
(qk_rope_head_dim, rotated). A page is [block_size, kv_lora_rank + qk_rope_head_dim]; for Kimi
K2.5 that is 576 values per token and layer instead of 64 heads x (192 + 128) = 20480.

Two ways to attend over it, the same function up to rounding:
- prefill (many queries per key): expand the context's latents into per-head K = [W_UK c, k_pe]
  and V = W_UV c (kv_b_proj) and run ordinary attention; the expansion is paid once per span.
- decode (one query per sequence): the absorbed form. q_nope . (W_UK c) = (W_UK^T q_nope) . c,
  so each head's query moves into latent space and attends to the cached latents directly, one
  shared "KV head" of width kv_lora_rank + rope (MQA); the output stays a latent until W_UV
  maps it to the head's value space. Nothing per head is ever materialized per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edgefire.models.attention import AttentionMetadata, PrefillSpan

# DeepSeek's q_a_layernorm and kv_a_layernorm are built without the config's eps: the released
# code (and HF transformers) give them 1e-6 whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


@dataclass(slots=True, frozen=True)
class YarnScaling:
    """YaRN context extension as DeepSeek-V3 / Kimi K2 configs give it (`rope_scaling`)."""

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @staticmethod
    def _mscale(factor: float, mscale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    @property
    def softmax_factor(self) -> float:
        """DeepSeek multiplies the softmax scale by mscale(factor, mscale_all_dim)^2."""
        m = self._mscale(self.factor, self.mscale_all_dim) if self.mscale_all_dim else 1.0
        return m * m

    @property
    def rotary_factor(self) -> float:
        """What cos/sin are multiplied by (1 when mscale == mscale_all_dim, as in Kimi K2)."""
        if self.mscale and self.mscale_all_dim:
            return (self._mscale(self.factor, self.mscale)
                    / self._mscale(self.factor, self.mscale_all_dim))
        return self._mscale(self.factor, 1.0)

    def inv_freq(self, dim: int, base: float) -> torch.Tensor:
        """Frequencies below the beta_slow..beta_fast band are interpolated (divided by
        factor), above it kept, with a linear ramp between."""
        def correction_dim(rotations: float) -> float:
            return (dim * math.log(self.original_max_position / (rotations * 2 * math.pi))
                    / (2 * math.log(base)))

        low = max(math.floor(correction_dim(self.beta_fast)), 0)
        high = min(math.ceil(correction_dim(self.beta_slow)), dim - 1)
        pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low)
                / (high - low if high != low else 0.001)).clamp(0, 1)
        extrapolate = 1 - ramp
        return (1.0 / (self.factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolate


class InterleavedRope:
    """RoPE on DeepSeek's interleaved pair layout ((x0, x1), (x2, x3), ...).

    The output is de-interleaved (all rotated first members, then all second ones), as HF
    transformers writes it: queries and keys get the same permutation, so their dot products
    are unchanged, and the cache holds keys in that order. cos/sin are computed per step from
    the positions (a few hundred values), so no table sized by the context window is kept.
    """

    def __init__(self, dim: int, base: float, scaling: YarnScaling | None) -> None:
        exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        self.inv_freq = scaling.inv_freq(dim, base) if scaling else 1.0 / (base**exponents)
        self.factor = scaling.rotary_factor if scaling else 1.0

    def __call__(self, positions: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, dim], k: [tokens, dim] (shared by the heads)."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        cos = (freqs.cos() * self.factor).to(q.dtype)
        sin = (freqs.sin() * self.factor).to(q.dtype)
        return _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x[..., 0::2], x[..., 1::2]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@dataclass(slots=True, frozen=True)
class MLADims:
    num_heads: int
    q_lora_rank: int | None  # None: queries projected straight from the hidden state (V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values the cache keeps per token and layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def q_width(self) -> int:
        """Width of the query part of the fused first projection."""
        return self.q_lora_rank or self.num_heads * self.qk_head_dim


@dataclass(slots=True)
class MLAWeights:
    # x -> [query latent (or the full query) | KV latent | shared RoPE key]: q_a_proj and
    # kv_a_proj_with_mqa fused, since both read the same x.
    qkv_a: torch.Tensor
    q_a_norm: torch.Tensor | None  # [q_lora_rank]
    q_b: torch.Tensor | None  # [heads * qk_head_dim, q_lora_rank]
    kv_a_norm: torch.Tensor  # [kv_lora_rank]
    kv_b: torch.Tensor  # [heads * (qk_nope + v_head), kv_lora_rank]: W_UK and W_UV stacked
    o: torch.Tensor  # [hidden, heads * v_head]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.qkv_a, self.q_a_norm, self.q_b, self.kv_a_norm, self.kv_b,
                            self.o) if t is not None]


class MultiHeadLatentAttention:
    def __init__(self, dims: MLADims, rope: InterleavedRope, scale: float) -> None:
        self.dims = dims
        self.rope = rope
        self.scale = scale

    def forward(self, x: torch.Tensor, positions: torch.Tensor, w: MLAWeights,
                cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """x: [tokens, hidden] (decodes first, as the runner packs them); cache: this layer's
        [num_blocks, block_size, latent_dim]. Stores the tokens' latents, returns o_proj's
        output [tokens, hidden]."""
        d = self.dims
        n = x.shape[0]
        q, c, k_pe = F.linear(x, w.qkv_a).split(
            [d.q_width, d.kv_lora_rank, d.qk_rope_head_dim], dim=-1)
        if w.q_b is not None:
            q = F.linear(F.rms_norm(q, (d.q_lora_rank,), w.q_a_norm, LATENT_NORM_EPS), w.q_b)
        q_nope, q_pe = q.view(n, d.num_heads, d.qk_head_dim).split(
            [d.qk_nope_head_dim, d.qk_rope_head_dim], dim=-1)
        c = F.rms_norm(c, (d.kv_lora_rank,), w.kv_a_norm, LATENT_NORM_EPS)
        q_pe, k_pe = self.rope(positions, q_pe, k_pe)
        flat = cache.view(-1, d.latent_dim)
        flat.index_copy_(0, meta.slot_mapping, torch.cat([c, k_pe], dim=-1).to(cache.dtype))

        out = x.new_empty(n, d.num_heads, d.v_head_dim)
        decodes = meta.num_decode_tokens
        if decodes:
            out[:decodes] = self._decode(q_nope[:decodes], q_pe[:decodes], w, cache, meta)
        for span in meta.prefills:
            rows = slice(span.token_start, span.token_start + span.num_tokens)
            out[rows] = self._prefill(q_nope[rows], q_pe[rows], w, cache, span)
        return F.linear(out.view(n, -1), w.o)

    def _split_kv_b(self, w: MLAWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [heads, qk_nope, kv_lora] and W_UV [heads, v_head, kv_lora], views of kv_b."""
        d = self.dims
        per_head = w.kv_b.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        return per_head[:, :d.qk_nope_head_dim], per_head[:, d.qk_nope_head_dim:]

    def _decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, w: MLAWeights,
                cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        d = self.dims
        n = q_nope.shape[0]
        w_uk, w_uv = self._split_kv_b(w)
        # Absorb W_UK into the query: [heads, n, qk_nope] @ [heads, qk_nope, kv_lora].
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
        q = torch.cat([q_latent, q_pe], dim=-1)  # [n, heads, latent_dim]
        tables = meta.decode_block_tables
        pages = cache.index_select(0, tables.reshape(-1)).view(n, -1, d.latent_dim).to(q.dtype)
        # Per sequence, its heads are the queries of one latent KV head (MQA): two batched
        # matmuls over the gathered pages, the values being the latents themselves. (SDPA
        # takes its slow path here, K and V being of different widths: 3x the step time.)
        scores = torch.bmm(q, pages.transpose(1, 2)).float() * self.scale  # [n, heads, ctx]
        scores.masked_fill_(~meta.decode_mask.reshape(n, 1, -1), float("-inf"))
        probs = scores.softmax(dim=-1).to(q.dtype)
        latent = torch.bmm(probs, pages[..., :d.kv_lora_rank])  # [n, heads, kv_lora]
        # W_UV after attention: [heads, n, kv_lora] @ [heads, kv_lora, v_head].
        return torch.bmm(latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, w: MLAWeights,
                 cache: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        d = self.dims
        length = span.context_len
        # Read the context back from the cache, this span's own tokens included, so a span
        # computes the same whether its prefix came from this request or the prefix cache.
        pages = cache.index_select(0, span.block_table).view(-1, d.latent_dim)[:length]
        c, k_pe = pages.to(q_nope.dtype).split([d.kv_lora_rank, d.qk_rope_head_dim], dim=-1)
        kv = F.linear(c, w.kv_b).view(length, d.num_heads, d.qk_nope_head_dim + d.v_head_dim)
        k_nope, v = kv.split([d.qk_nope_head_dim, d.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, None].expand(-1, d.num_heads, -1)], dim=-1)
        q = torch.cat([q_nope, q_pe], dim=-1)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=span.mask, is_causal=span.mask is None, scale=self.scale)
        return o[0].transpose(0, 1)  # [tokens, heads, v_head]
