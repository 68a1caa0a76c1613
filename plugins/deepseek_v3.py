"""Built-in architecture: the DeepSeek-V3 family (Kimi K2.5), as a runnable miniature.

A catalog entry with `architecture: deepseek_v3` and `weights: miniature://seed` is built from
its real `config:` overlaid with its `miniature:` mapping: the sizes it shrinks (same key
names), the seed its weights are drawn from, and the GGUF whose tokenizer it borrows. The
weights are random: the model runs the real architecture end to end (paged latent cache,
routing, every engine feature), but the text it writes means nothing, and every answer says so
(x-edgefire-miniature). There is no
loader for real DeepSeek-V3/Kimi checkpoints: ~600 GB do not fit this machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from edgefire.contract.catalog import ModelSpec
from edgefire.contract.errors import ModelUnavailableError
from edgefire.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import LoadedLM
from edgefire.runtime.plugins import hookimpl
from edgefire.runtime.tokenizer import load_gguf_tokenizer
from edgefire.runtime.weights import read_gguf, resolve_source
from edgefire.runtime.weights.codec import WeightCodec, through_codec

SEEDED = "miniature://seed"
# Spread of the seeded e_score_correction_bias: large enough to change which experts a token
# picks (router scores spread about 0.2), so the bias path is exercised, not left at zero.
BIAS_STD = 0.1


def load_deepseek_v3(spec: ModelSpec, precision: Precision, codec: WeightCodec) -> LoadedLM:
    mini = spec.extra.get("miniature")
    if spec.weights != SEEDED or not mini:
        raise ModelUnavailableError(
            f"{spec.id}: the deepseek_v3 architecture runs only seeded miniatures "
            f"(weights: {SEEDED} and a miniature: entry), not {spec.weights!r}", field="model")
    if getattr(codec, "to_resident", None) is not None:
        raise ModelUnavailableError(f"{spec.id}: codec {codec.name!r} keeps a resident form "
                                    "the deepseek_v3 architecture does not run", field="model")
    # The real config with the miniature's sizes over it: what is not shrunk stays real.
    config = DeepseekV3Config.from_mapping({**spec.extra.get("config", {}), **mini})
    tokenizer = load_gguf_tokenizer(read_gguf(resolve_source(mini["tokenizer"])).reader)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{spec.id}: vocab_size {config.vocab_size} is smaller than its "
                         f"tokenizer's {tokenizer.vocab_size}")
    weights = dict(through_codec(seeded_weights(config, int(mini["seed"])), codec))
    model = DeepseekV3ForCausalLM(config, weights, precision.dtypes, precision.kv)
    return LoadedLM(spec, model, tokenizer, config.vocab_size, spec.context_window)


def seeded_weights(config: DeepseekV3Config,
                   seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of `config`, named as HF transformers names DeepseekV3ForCausalLM's, drawn
    in a fixed order from one torch.Generator: the same seed gives the same model anywhere.

    Matrices are N(0, 1/fan_in) so activations keep unit scale through the layers (attention
    is peaked rather than uniform, logits spread about 1); norms are 1.
    """
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float | None = None) -> torch.Tensor:
        scale = std if std is not None else 1 / math.sqrt(shape[-1])
        return torch.randn(*shape, generator=generator) * scale

    for name, shape in _shapes(config):
        if name.endswith(("norm.weight", "layernorm.weight")):
            yield name, torch.ones(shape)
        elif name.endswith("e_score_correction_bias"):
            yield name, normal(*shape, std=BIAS_STD)
        elif name == "model.embed_tokens.weight":
            yield name, normal(*shape, std=1.0)
        else:
            yield name, normal(*shape)


def _shapes(c: DeepseekV3Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    hidden, heads = c.hidden_size, c.num_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    yield "model.embed_tokens.weight", (c.vocab_size, hidden)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (hidden,)
        a = p + "self_attn."
        if c.q_lora_rank:
            yield a + "q_a_proj.weight", (c.q_lora_rank, hidden)
            yield a + "q_a_layernorm.weight", (c.q_lora_rank,)
            yield a + "q_b_proj.weight", (heads * qk, c.q_lora_rank)
        else:
            yield a + "q_proj.weight", (heads * qk, hidden)
        yield a + "kv_a_proj_with_mqa.weight", (c.kv_lora_rank + c.qk_rope_head_dim, hidden)
        yield a + "kv_a_layernorm.weight", (c.kv_lora_rank,)
        yield a + "kv_b_proj.weight", (heads * (c.qk_nope_head_dim + c.v_head_dim),
                                       c.kv_lora_rank)
        yield a + "o_proj.weight", (hidden, heads * c.v_head_dim)
        yield p + "post_attention_layernorm.weight", (hidden,)
        m = p + "mlp."
        if i < c.first_k_dense_replace:
            yield from _swiglu(m, hidden, c.intermediate_size)
            continue
        experts, inner = c.n_routed_experts, c.moe_intermediate_size
        yield m + "gate.weight", (experts, hidden)
        yield m + "gate.e_score_correction_bias", (experts,)
        yield m + "experts.gate_up_proj", (experts, 2 * inner, hidden)
        yield m + "experts.down_proj", (experts, hidden, inner)
        if c.n_shared_experts:
            yield from _swiglu(m + "shared_experts.", hidden, inner * c.n_shared_experts)
    yield "model.norm.weight", (hidden,)
    if not c.tie_embeddings:
        yield "lm_head.weight", (c.vocab_size, hidden)


def _swiglu(prefix: str, hidden: int, inner: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield prefix + "gate_proj.weight", (inner, hidden)
    yield prefix + "up_proj.weight", (inner, hidden)
    yield prefix + "down_proj.weight", (hidden, inner)


@hookimpl
def edgefire_register_models(register):
    register("deepseek_v3", load_deepseek_v3)
