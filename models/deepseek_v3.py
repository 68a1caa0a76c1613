"""DeepSeek-V3 family decoder (DeepSeek-V3, Kimi K2 / K2.5's text model) over a paged latent cache.

Each layer: RMSNorm -> multi-head latent attention (models/mla.py) -> RMSNorm -> MLP, where the
first `first_k_dense_replace` layers have a dense SwiGLU MLP and the rest a mixture of experts
(models/moe.py: sigmoid or softmax scores, group-limited top-k, a correction bias that only
chooses, normalized weights times routed_scaling_factor, plus the shared experts).

Weights come as a dict named as HF transformers 5 names DeepseekV3ForCausalLM's state dict
(`model.layers.3.self_attn.kv_b_proj.weight`, `model.layers.3.mlp.experts.gate_up_proj`, …),
so the same tensors load into both (tests/test_deepseek_v3.py does).
Not modelled: the multi-token-prediction layer (num_nextn_predict_layers, a draft head),
moe_layer_freq other than 1, and attention biases (all false in DeepSeek-V3 and Kimi K2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from edgefire.models.attention import AttentionMetadata
from edgefire.models.mla import (
    InterleavedRope,
    MLADims,
    MLAWeights,
    MultiHeadLatentAttention,
    YarnScaling,
)
from edgefire.models.moe import Experts, MoE, RouterSpec, SwiGLU
from edgefire.models.precision import dense_precision, layered_bytes


@dataclass(slots=True, frozen=True)
class DeepseekV3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    moe_intermediate_size: int  # each routed (and shared) expert's
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    scoring_func: str = "sigmoid"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = None
    tie_embeddings: bool = False

    # The catalog's key names where they differ from the fields (it uses HF's config names).
    _ALIASES = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
                "tie_word_embeddings": "tie_embeddings"}

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> DeepseekV3Config:
        """From a catalog `config:` or `miniature:` mapping; keys that are not fields (params_b,
        weight_dtype, seed, …) are ignored. `rope_scaling` is HF's dict (type yarn)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {cls._ALIASES.get(k, k): v for k, v in config.items()}
        fields = {k: v for k, v in fields.items() if k in names}
        scaling = fields.get("rope_scaling")
        if isinstance(scaling, Mapping):
            kind = scaling.get("type", scaling.get("rope_type"))
            if kind != "yarn":
                raise ValueError(f"rope_scaling type {kind!r} is not supported (only yarn)")
            fields["rope_scaling"] = YarnScaling(
                factor=float(scaling["factor"]),
                original_max_position=int(scaling["original_max_position_embeddings"]),
                beta_fast=float(scaling.get("beta_fast", 32.0)),
                beta_slow=float(scaling.get("beta_slow", 1.0)),
                mscale=float(scaling.get("mscale", 1.0)),
                mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)))
        return cls(**fields)

    @property
    def mla(self) -> MLADims:
        return MLADims(self.num_heads, self.q_lora_rank, self.kv_lora_rank,
                       self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)

    @property
    def router(self) -> RouterSpec:
        return RouterSpec(self.num_experts_per_tok, self.scoring_func, self.n_group,
                          self.topk_group, self.norm_topk_prob, self.routed_scaling_factor)

    @property
    def softmax_scale(self) -> float:
        factor = self.rope_scaling.softmax_factor if self.rope_scaling else 1.0
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5 * factor

    def kv_values_per_token(self) -> int:
        """What the paged cache holds per token: the latent and the RoPE key, every layer."""
        return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)


@dataclass(slots=True)
class DecoderLayer:
    attn_norm: torch.Tensor
    attn: MLAWeights
    mlp_norm: torch.Tensor
    mlp: SwiGLU | MoE

    def tensors(self) -> list[torch.Tensor]:
        mlp = [self.mlp.gate_up, self.mlp.down] if isinstance(self.mlp, SwiGLU) else (
            self.mlp.tensors())
        return [self.attn_norm, self.mlp_norm, *self.attn.tensors(), *mlp]


@dataclass(slots=True)
class DeepseekV3Weights:
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    layers: list[DecoderLayer]

    @classmethod
    def build(cls, c: DeepseekV3Config, weights: Mapping[str, torch.Tensor],
              dtype: torch.dtype) -> DeepseekV3Weights:
        def get(name: str) -> torch.Tensor:
            return weights[name].to(dtype)

        layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            if c.q_lora_rank:
                q, q_norm, q_b = get(a + "q_a_proj.weight"), get(a + "q_a_layernorm.weight"), get(
                    a + "q_b_proj.weight")
            else:
                q, q_norm, q_b = get(a + "q_proj.weight"), None, None
            attn = MLAWeights(torch.cat([q, get(a + "kv_a_proj_with_mqa.weight")]), q_norm, q_b,
                              get(a + "kv_a_layernorm.weight"), get(a + "kv_b_proj.weight"),
                              get(a + "o_proj.weight"))
            layers.append(DecoderLayer(get(p + "input_layernorm.weight"), attn,
                                       get(p + "post_attention_layernorm.weight"),
                                       _mlp(c, weights, p + "mlp.", i, dtype)))
        embed = get("model.embed_tokens.weight")
        lm_head = embed if c.tie_embeddings else get("lm_head.weight")
        return cls(embed, get("model.norm.weight"), lm_head, layers)


def _mlp(c: DeepseekV3Config, weights: Mapping[str, torch.Tensor], p: str, layer: int,
         dtype: torch.dtype) -> SwiGLU | MoE:
    def dense(prefix: str) -> SwiGLU:
        gate_up = torch.cat([weights[prefix + "gate_proj.weight"],
                             weights[prefix + "up_proj.weight"]])
        return SwiGLU(gate_up.to(dtype), weights[prefix + "down_proj.weight"].to(dtype))

    if layer < c.first_k_dense_replace:
        return dense(p)
    bias = weights.get(p + "gate.e_score_correction_bias")
    return MoE(router=weights[p + "gate.weight"].float(),
               bias=None if bias is None else bias.float(),
               experts=Experts(weights[p + "experts.gate_up_proj"].to(dtype),
                              weights[p + "experts.down_proj"].to(dtype)),
               shared=dense(p + "shared_experts.") if c.n_shared_experts else None,
               spec=c.router)


class DeepseekV3ForCausalLM:
    """Forward pass over a packed batch; each layer's latents live in the runner's paged cache.

    Weights may be held in several compute dtypes (float32 and bfloat16); the caller picks one
    per step, as for models/llama.py. The routers stay float32 in every copy.
    """

    def __init__(self, config: DeepseekV3Config, weights: Mapping[str, torch.Tensor],
                 dtypes: tuple[torch.dtype, ...], kv_dtype: torch.dtype | None = None) -> None:
        self.config = config
        self.params = {dtype: DeepseekV3Weights.build(config, weights, dtype) for dtype in dtypes}
        self.dtypes = dtypes
        self.kv_dtype = kv_dtype or dtypes[0]
        rope = InterleavedRope(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)
        self.attention = MultiHeadLatentAttention(config.mla, rope, config.softmax_scale)
        self.weight_precision = dense_precision(dtypes)

    @property
    def weight_bytes(self) -> int:
        return layered_bytes(self.params.values())

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        # No head axis and no K/V pair: one latent row per token (models/mla.py).
        c = self.config
        return (c.num_layers, num_blocks, block_size, c.kv_lora_rank + c.qk_rope_head_dim)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, in `dtype`."""
        c = self.config
        w = self.params[dtype or self.dtypes[0]]
        eps = c.rms_norm_eps
        h = F.embedding(input_ids, w.embed)
        for i, layer in enumerate(w.layers):
            x = F.rms_norm(h, (c.hidden_size,), layer.attn_norm, eps)
            h = h + self.attention.forward(x, positions, layer.attn, kv_cache[i], meta)
            x = F.rms_norm(h, (c.hidden_size,), layer.mlp_norm, eps)
            h = h + layer.mlp(x)
        return F.rms_norm(h, (c.hidden_size,), w.final_norm, eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [rows, vocab], using the lm_head of hidden's dtype."""
        return F.linear(hidden, self.params[hidden.dtype].lm_head).float()
