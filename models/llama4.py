"""Llama 4 text decoder (Scout): MoE feed-forward, interleaved chunked-local and global attention.

As Meta's model and HF's Llama4 classes define it:
- every layer's feed-forward is a mixture of experts (models/moe.py): the top-1 of 16 experts
  by router logit takes the token scaled by that logit's sigmoid (not normalised, and applied
  to the expert's input rather than its output), and a shared expert takes every token
  unscaled; or every `interleave_moe_layer_step`-th layer is, with dense MLPs between
  (Maverick; Scout's step is 1);
- three of every four layers (`no_rope_layer_interval: 4`) use RoPE (interleaved pairs, Llama 3
  frequency scaling) followed by an L2 norm of Q and K (`use_qk_norm`), and attend only within
  their `attention_chunk_size` chunk; every fourth layer uses no position encoding (NoPE) and
  attends to the whole context, its queries scaled up with position past `floor_scale`
  (`attn_temperature_tuning`);
- RMSNorm before attention and feed-forward, untied LM head (configurable).

The paged KV cache holds every layer's K/V for the whole context; local layers read only their
chunk's pages (models/attention/chunked.py). The real deployment's memory saving, local layers
keeping only the current chunk's KV, would need a second page pool per sequence in the engine's
block manager, which this engine does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from edgefire.models.attention import AttentionBackend, AttentionMetadata
from edgefire.models.attention.chunked import chunked_local_view
from edgefire.models.llama import PagedGQADecoder
from edgefire.models.moe import Experts, MoE, RouterSpec, SwiGLU
from edgefire.models.precision import layered_bytes, per_dtype
from edgefire.models.rotary import InterleavedRotaryEmbedding, llama3_scaled, rope_inv_freq
from edgefire.models.row_buckets import blocked_linear, dense_linear


@dataclass(slots=True, frozen=True)
class Llama4Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # each routed expert's and the shared expert's
    num_local_experts: int
    num_experts_per_tok: int
    max_position: int
    rope_theta: float = 500000.0
    # Llama 3 scaling {factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings} (HF's names); None: plain RoPE frequencies.
    rope_scaling: dict[str, float] | None = None
    rms_norm_eps: float = 1e-5
    attention_chunk_size: int | None = 8192  # None: RoPE layers attend globally too
    no_rope_layer_interval: int = 4
    use_qk_norm: bool = True
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1
    interleave_moe_layer_step: int = 1
    intermediate_size_mlp: int = 0  # dense layers' MLP (only with interleave_moe_layer_step > 1)
    tie_embeddings: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Llama4Config:
        """Build from a catalog mapping, ignoring keys that are not fields (params_b, …)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def uses_rope(self, layer: int) -> bool:
        """RoPE (and chunked local attention) on three of every four layers; NoPE on the last."""
        return (layer + 1) % self.no_rope_layer_interval != 0

    def is_chunked(self, layer: int) -> bool:
        return self.attention_chunk_size is not None and self.uses_rope(layer)

    def is_moe(self, layer: int) -> bool:
        step = self.interleave_moe_layer_step
        return layer % step == step - 1

    def inv_freq(self) -> torch.Tensor:
        inv_freq = rope_inv_freq(self.head_dim, self.rope_theta)
        s = self.rope_scaling
        if s is None:
            return inv_freq
        return llama3_scaled(inv_freq, s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                             int(s["original_max_position_embeddings"]))


@dataclass(slots=True)
class Llama4Layer:
    attn_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: torch.Tensor
    mlp_norm: torch.Tensor
    ffn: MoE | SwiGLU

    def tensors(self) -> tuple[torch.Tensor, ...]:
        ffn = self.ffn.tensors() if isinstance(self.ffn, MoE) else (
            self.ffn.gate_up, self.ffn.down)
        return (self.attn_norm, self.qkv, self.o, self.mlp_norm, *ffn)


@dataclass(slots=True)
class Llama4Weights:
    """The whole model's weights in one compute dtype."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    layers: list[Llama4Layer]
    rotary: InterleavedRotaryEmbedding

    @classmethod
    def build(cls, config: Llama4Config, weights: dict[str, torch.Tensor],
              dtype: torch.dtype) -> Llama4Weights:
        # `.to` is a no-op on tensors already in dtype, which keeps a derived model's shared
        # (stride-0) expert copies shared instead of materialising them.
        def get(name: str) -> torch.Tensor:
            return weights[name].to(dtype)

        # Llama 4's rule: the top-k router logits through a sigmoid each, not renormalised.
        router = RouterSpec(config.num_experts_per_tok, "sigmoid", norm_topk_prob=False)
        layers = []
        for i in range(config.num_layers):
            p = f"layers.{i}."
            if config.is_moe(i):
                # The router stays float32 in every copy (models/moe.py: a narrower one flips
                # near-tied choices; HF's Llama4Router runs in the model's dtype).
                ffn: MoE | SwiGLU = MoE(
                    weights[p + "router"].float(), None,
                    Experts(get(p + "experts_gate_up"), get(p + "experts_down")),
                    SwiGLU(get(p + "shared_gate_up"), get(p + "shared_down")), router,
                    scale_inputs=True)
            else:
                ffn = SwiGLU(get(p + "gate_up"), get(p + "down"))
            layers.append(Llama4Layer(get(p + "attn_norm"), get(p + "qkv"), get(p + "o"),
                                      get(p + "mlp_norm"), ffn))
        embed = get("embed")
        lm_head = embed if config.tie_embeddings else get("lm_head")
        rotary = InterleavedRotaryEmbedding(config.inv_freq(), config.max_position)
        return cls(embed, get("final_norm"), lm_head, layers, rotary.to(dtype))


def _linear_for(row_block: int | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if row_block is None:
        return dense_linear
    return lambda x, w: blocked_linear(x, lambda b: F.linear(b, w), row_block)


class Llama4ForCausalLM(PagedGQADecoder):
    """Forward pass over a packed batch of tokens; K/V live in a paged cache owned by the runner.

    Weights may be held in several compute dtypes, picked per step, as models/llama.py does.
    """

    def __init__(self, config: Llama4Config,
                 weights: dict[str, torch.Tensor] | dict[torch.dtype, dict[str, torch.Tensor]],
                 dtypes: tuple[torch.dtype, ...], kv_dtype: torch.dtype | None = None,
                 attention: AttentionBackend | None = None) -> None:
        """weights: one dict cast to each dtype, or one dict per dtype already in it."""
        c = config
        self.config = config
        held = per_dtype(weights, dtypes)
        self.params = {dtype: Llama4Weights.build(c, held[dtype], dtype) for dtype in dtypes}
        self._paged_gqa(c, dtypes, kv_dtype, attention)

    @property
    def weight_bytes(self) -> int:
        return layered_bytes(self.params.values())

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, dtype: torch.dtype | None = None,
                row_block: int | None = None) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, in `dtype`; with row_block,
        every projection runs in blocks of that many rows (deterministic mode)."""
        c = self.config
        dtype = dtype or self.dtypes[0]
        w = self.params[dtype]
        linear = _linear_for(row_block)
        eps = c.rms_norm_eps
        n = input_ids.shape[0]
        local = (chunked_local_view(meta, c.attention_chunk_size, kv_cache.shape[-2])
                 if c.attention_chunk_size is not None else meta)
        nope_scale = self._temperature(positions, dtype)
        h = F.embedding(input_ids, w.embed)
        for i, layer in enumerate(w.layers):
            x = F.rms_norm(h, (c.hidden_size,), layer.attn_norm, eps)
            q, k, v = linear(x, layer.qkv).split([self.q_size, self.kv_size, self.kv_size], -1)
            q = q.view(n, c.num_heads, c.head_dim)
            k = k.view(n, c.num_kv_heads, c.head_dim)
            if c.uses_rope(i):
                q, k = w.rotary(positions, q, k)
                if c.use_qk_norm:  # an L2 norm without weight, over each head
                    q = F.rms_norm(q, (c.head_dim,), None, eps)
                    k = F.rms_norm(k, (c.head_dim,), None, eps)
            elif nope_scale is not None:
                q = q * nope_scale
            attn = self.attention.forward(q, k, v.view(n, c.num_kv_heads, c.head_dim),
                                          kv_cache[i], local if c.is_chunked(i) else meta)
            h = h + linear(attn, layer.o)
            x = F.rms_norm(h, (c.hidden_size,), layer.mlp_norm, eps)
            h = h + layer.ffn(x, linear)
        return F.rms_norm(h, (c.hidden_size,), w.final_norm, eps)

    def _temperature(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """NoPE layers' query scale 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)),
        [tokens, 1, 1]; None while every position is below floor_scale - 1 (all scales 1)."""
        c = self.config
        if not c.attn_temperature_tuning or int(positions.max()) + 1 < c.floor_scale:
            return None
        steps = torch.floor((positions.float() + 1.0) / c.floor_scale)
        return (torch.log1p(steps) * c.attn_scale + 1.0).to(dtype)[:, None, None]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, row_block: int | None = None) -> torch.Tensor:
        """Float32 logits [rows, vocab], using the lm_head of hidden's dtype."""
        return _linear_for(row_block)(hidden, self.params[hidden.dtype].lm_head).float()


def weights_from_hf(config: Llama4Config,
                    state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map an HF Llama4ForCausalLM state dict (`model.layers.N.…`) to this module's fused
    weights. HF keeps expert weights as x @ W ([experts, in, out]); here they are [out, in]
    like every other projection."""
    p = "model."
    out = {"embed": state[p + "embed_tokens.weight"], "final_norm": state[p + "norm.weight"]}
    if not config.tie_embeddings:
        out["lm_head"] = state["lm_head.weight"]
    for i in range(config.num_layers):
        src, dst = f"{p}layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        out[dst + "attn_norm"] = state[src + "input_layernorm.weight"]
        out[dst + "qkv"] = torch.cat([state[f"{attn}{x}_proj.weight"] for x in "qkv"])
        out[dst + "o"] = state[attn + "o_proj.weight"]
        out[dst + "mlp_norm"] = state[src + "post_attention_layernorm.weight"]
        ffn = src + "feed_forward."
        if config.is_moe(i):
            out[dst + "router"] = state[ffn + "router.weight"]
            out[dst + "experts_gate_up"] = state[ffn + "experts.gate_up_proj"].transpose(1, 2)
            out[dst + "experts_down"] = state[ffn + "experts.down_proj"].transpose(1, 2)
            ffn, dst = ffn + "shared_expert.", dst + "shared_"
        out[dst + "gate_up"] = torch.cat([state[ffn + "gate_proj.weight"],
                                          state[ffn + "up_proj.weight"]])
        out[dst + "down"] = state[ffn + "down_proj.weight"]
    return {name: t.contiguous() for name, t in out.items()}
