"""Built-in architecture: Llama 4 (Scout), runnable here as a miniature upcycled from SmolLM2.

The catalog entry keeps the real model's config under `config:` (for planning) and the
miniature's beside it under `miniature:` (its sizes, the SmolLM2 GGUF it derives from under
`source`, the router's `router_seed`); `weights: miniature://smollm2-upcycle` names how the
miniature's weights are made (models/llama4.py has the architecture):

- attention, norms, embeddings and tokenizer are SmolLM2-135M's (its GGUF's Q/K rows are
  already in the interleaved-pair RoPE layout Llama 4 uses, so they are taken as they are);
- sparse upcycling of each layer's MLP: the shared expert and all 16 routed experts are that
  MLP with its down projection halved. A routed expert sees sigmoid(router logit) * x, so the
  router is built to make that sigmoid 1 to float precision: its rows are 8 seeded random unit
  directions and their negations, scaled so the top-1 logit is large; every token then goes to
  the expert whose direction it leans to, and shared + routed = 0.5 MLP(x) + 0.5 MLP(x).
  The 16 expert copies are one tensor viewed 16 times (stride 0): identical by construction,
  they take one copy's memory.

What is not SmolLM2 is the attention pattern: NoPE on every fourth layer, chunked attention
and QK norm on the others change what the SmolLM2 weights compute (README, "Llama 4 Scout
miniature", has the measured effect).
"""

from __future__ import annotations

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.models.llama4 import Llama4Config, Llama4ForCausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import LoadedLM
from edgefire.runtime.plugins import hookimpl
from edgefire.runtime.tokenizer import load_gguf_tokenizer
from edgefire.runtime.weights import read_gguf, resolve_source
from edgefire.runtime.weights.codec import WeightCodec, through_codec

UPCYCLE = "miniature://smollm2-upcycle"
# Router scale: the top-1 logit is ROUTER_LOGIT times the token's largest |cosine|-like
# projection (typically > 1, rarely under 0.3), so sigmoid(logit) rounds to 1 in float32.
ROUTER_LOGIT = 40.0
_GGUF_NAMES = {"attn_norm": "attn_norm", "ffn_norm": "mlp_norm", "attn_output": "o"}


def load_llama4_miniature(spec: ModelSpec, precision: Precision, codec: WeightCodec) -> LoadedLM:
    if spec.weights != UPCYCLE:
        raise ValueError(f"{spec.id}: llama4 weights must be {UPCYCLE!r}, not {spec.weights!r}")
    if getattr(codec, "to_resident", None) is not None:
        raise ValueError(f"{spec.id}: codec {spec.codec!r} keeps a resident form, which the "
                         "llama4 miniature does not take")
    mini = spec.extra["miniature"]
    config = Llama4Config.from_dict(mini)
    gguf = read_gguf(resolve_source(mini["source"]))
    source = dict(through_codec(gguf.tensors(torch.float32), codec))
    per_dtype = {dtype: upcycle_smollm2(config, source, dtype, int(mini.get("router_seed", 0)))
                 for dtype in precision.dtypes}
    model = Llama4ForCausalLM(config, per_dtype, precision.dtypes, precision.kv)
    max_len = min(config.max_position, spec.context_window)
    return LoadedLM(spec, model, load_gguf_tokenizer(gguf.reader), config.vocab_size, max_len)


def upcycle_smollm2(config: Llama4Config, gguf: dict[str, torch.Tensor], dtype: torch.dtype,
                    seed: int) -> dict[str, torch.Tensor]:
    """The miniature's weights in `dtype` from SmolLM2's GGUF tensors (names as llama.cpp's)."""
    if config.num_local_experts % 2:
        raise ValueError("upcycling pairs each router direction with its negation: "
                         "num_local_experts must be even")
    generator = torch.Generator().manual_seed(seed)
    out = {"embed": gguf["token_embd.weight"].to(dtype),
           "final_norm": gguf["output_norm.weight"].to(dtype)}
    if not config.tie_embeddings:
        out["lm_head"] = gguf.get("output.weight", gguf["token_embd.weight"]).to(dtype)
    for i in range(config.num_layers):
        src, dst = f"blk.{i}.", f"layers.{i}."
        out[dst + "qkv"] = torch.cat([gguf[f"{src}attn_{x}.weight"] for x in "qkv"]).to(dtype)
        for gguf_name, name in _GGUF_NAMES.items():
            out[dst + name] = gguf[f"{src}{gguf_name}.weight"].to(dtype)
        gate_up = torch.cat([gguf[src + "ffn_gate.weight"], gguf[src + "ffn_up.weight"]])
        down = gguf[src + "ffn_down.weight"]
        if not config.is_moe(i):  # a dense layer (interleave_moe_layer_step > 1) keeps the MLP
            out[dst + "gate_up"], out[dst + "down"] = gate_up.to(dtype), down.to(dtype)
            continue
        out[dst + "router"] = _router(config, gguf[src + "ffn_norm.weight"], generator)
        # Shared and routed expert each give half: their sum is the MLP when the score is 1.
        gate_up, down = gate_up.to(dtype), (down * 0.5).to(dtype)
        out[dst + "shared_gate_up"], out[dst + "shared_down"] = gate_up, down
        experts = config.num_local_experts
        out[dst + "experts_gate_up"] = gate_up.expand(experts, *gate_up.shape)
        out[dst + "experts_down"] = down.expand(experts, *down.shape)
    return out


def _router(config: Llama4Config, mlp_norm: torch.Tensor,
            generator: torch.Generator) -> torch.Tensor:
    # The router sees rms_norm(h) * mlp_norm, whose size is about rms(mlp_norm) per dimension:
    # dividing by it makes the top logit ~ROUTER_LOGIT * |N(0, 1)| whatever the layer's norm.
    directions = torch.randn(config.num_local_experts // 2, config.hidden_size,
                             generator=generator)
    directions /= directions.norm(dim=-1, keepdim=True)
    scale = ROUTER_LOGIT / float(mlp_norm.pow(2).mean().sqrt())
    return torch.stack([directions, -directions], dim=1).flatten(0, 1) * scale


@hookimpl
def edgefire_register_models(register):
    register("llama4_moe", load_llama4_miniature)
