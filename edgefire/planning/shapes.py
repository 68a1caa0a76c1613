"""A model's weights and KV cache, layer by layer, from its real config (catalog `config:`).

Counts come from the architecture's formulas, not from the config's `params_b` (that figure is
the publisher's, checked against ours in tests/test_planning.py), so a miniature's config gives
the miniature's size. Each layer says what one token's K/V costs in it: grouped-query
attention stores 2·kv_heads·head_dim elements; multi-head latent attention stores the
compressed latent and the shared RoPE key, kv_lora_rank + qk_rope_head_dim; a chunked-local
layer (Llama 4) keeps at most its chunk of tokens per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edgefire.contract.errors import PlanningError

# Routers (and DeepSeek's correction bias) stay float32, as the released checkpoints keep them
# and the node's MoE holds them (models/moe.py: a narrower router flips near-tied choices).
ROUTER_DTYPE = "fp32"


@dataclass(slots=True, frozen=True)
class Weights:
    """One group of weights: a codec covers it by `kind`, tensor parallelism shards it unless
    `replicated`, and `dtype_key` names the config key that sets its format."""

    role: str  # attention, mlp, routed_experts, shared_experts, router, embed, lm_head, norms
    params: int
    rows: int = 0  # output rows of its matrices (per-channel scales)
    kind: str = "projections"  # projections, embeddings or other (never re-encoded)
    replicated: bool = False
    dtype_key: str = "weight_dtype"
    fixed: str | None = None  # a format the group keeps whatever the config or the node says


@dataclass(slots=True, frozen=True)
class LayerKV:
    elements: int  # KV elements one token stores in this layer (all heads)
    heads: int  # KV heads tensor parallelism splits; 0: one latent every rank keeps whole
    window: int | None = None  # chunked-local: at most this many tokens per sequence


@dataclass(slots=True, frozen=True)
class Layer:
    weights: tuple[Weights, ...]
    kv: LayerKV | None  # None: an encoder layer (no cache)
    act_width: int  # activation elements per token that tensor parallelism shards


@dataclass(slots=True, frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    vocab_size: int
    head: tuple[Weights, ...]  # before the first layer (first pipeline stage)
    layers: tuple[Layer, ...]
    tail: tuple[Weights, ...]  # after the last layer (last pipeline stage)

    @property
    def params(self) -> int:
        groups = [*self.head, *self.tail, *(w for layer in self.layers for w in layer.weights)]
        return sum(w.params for w in groups)

    @property
    def encoder(self) -> bool:
        return all(layer.kv is None for layer in self.layers)


def _int(config: Mapping, key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PlanningError(f"config {key} must be a whole number, not {value!r}", field=key)
    return value


def _ends(c: Mapping, hidden: int, vocab: int, tied: bool) -> tuple[tuple, tuple]:
    head = (Weights("embed", vocab * hidden, vocab, "embeddings"),)
    tail = [Weights("norms", hidden, kind="other", replicated=True)]
    if not tied:
        tail.append(Weights("lm_head", vocab * hidden, vocab, "embeddings"))
    return head, tuple(tail)


def _gqa(c: Mapping, hidden: int) -> tuple[Weights, LayerKV, int]:
    heads, kv_heads = _int(c, "num_heads"), _int(c, "num_kv_heads", c.get("num_heads"))
    head_dim = _int(c, "head_dim", hidden // max(heads, 1))
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = Weights("attention", hidden * (q + 2 * kv) + q * hidden, q + 2 * kv + hidden)
    return attention, LayerKV(2 * kv, kv_heads), q + 2 * kv + q


def _mlp(role: str, hidden: int, inter: int, count: int = 1) -> Weights:
    """SwiGLU: gate and up (hidden → inter), down (inter → hidden)."""
    return Weights(role, count * 3 * hidden * inter, count * (2 * inter + hidden),
                   dtype_key="routed_expert_dtype" if role == "routed_experts" else
                   "weight_dtype")


def _stored(c: Mapping, experts: int) -> int:
    """Routed experts whose weights are held: all of them, unless the config says fewer
    (`stored_experts`: a miniature upcycled from a dense model may keep its experts as views
    of one MLP, which take the memory of one, or none when that MLP is the shared expert's)."""
    return min(_int(c, "stored_experts", experts), experts)


def _norms(hidden: int, count: int = 2) -> Weights:
    return Weights("norms", count * hidden, kind="other", replicated=True)


def llama(c: Mapping) -> ModelShape:
    hidden, inter, layers = _int(c, "hidden_size"), _int(c, "intermediate_size"), \
        _int(c, "num_layers")
    attention, kv, act = _gqa(c, hidden)
    layer = Layer((attention, _mlp("mlp", hidden, inter), _norms(hidden)), kv, act + 3 * inter)
    head, tail = _ends(c, hidden, _int(c, "vocab_size"), bool(c.get("tie_embeddings")))
    return ModelShape("llama", hidden, _int(c, "vocab_size"), head, (layer,) * layers, tail)


def llama4_moe(c: Mapping) -> ModelShape:
    """Llama 4: every `interleave_moe_layer_step`-th layer is MoE (routed experts of
    intermediate_size plus one shared expert of the same size), the others dense
    (intermediate_size_mlp); every `no_rope_layer_interval`-th layer is a global NoPE layer,
    the others attend within chunks of attention_chunk_size tokens."""
    hidden, layers = _int(c, "hidden_size"), _int(c, "num_layers")
    inter, dense_inter = _int(c, "intermediate_size"), _int(c, "intermediate_size_mlp", 0)
    experts, top_k = _int(c, "num_local_experts"), _int(c, "num_experts_per_tok", 1)
    step, interval = _int(c, "interleave_moe_layer_step", 1), _int(c, "no_rope_layer_interval")
    chunk = _int(c, "attention_chunk_size")
    attention, kv, act = _gqa(c, hidden)
    shaped = []
    for i in range(layers):
        if (i + 1) % max(step, 1) == 0:
            mlp = (_mlp("routed_experts", hidden, inter, _stored(c, experts)),
                   _mlp("shared_experts", hidden, inter),
                   Weights("router", experts * hidden, kind="other", replicated=True,
                           fixed=ROUTER_DTYPE))
            width = 3 * (top_k + 1) * inter + experts
        else:
            mlp, width = (_mlp("mlp", hidden, dense_inter),), 3 * dense_inter
        glob = interval > 0 and (i + 1) % interval == 0
        layer_kv = LayerKV(kv.elements, kv.heads, None if glob else chunk)
        shaped.append(Layer((attention, *mlp, _norms(hidden)), layer_kv, act + width))
    head, tail = _ends(c, hidden, _int(c, "vocab_size"), bool(c.get("tie_embeddings")))
    return ModelShape("llama4_moe", hidden, _int(c, "vocab_size"), head, tuple(shaped), tail)


def deepseek_v3(c: Mapping) -> ModelShape:
    """DeepSeek-V3 / Kimi K2: multi-head latent attention (low-rank Q, a compressed KV latent
    of kv_lora_rank plus a shared RoPE key of qk_rope_head_dim), the first
    first_k_dense_replace layers dense, the rest routed experts plus n_shared_experts."""
    hidden, layers, heads = _int(c, "hidden_size"), _int(c, "num_layers"), _int(c, "num_heads")
    q_rank, kv_rank = _int(c, "q_lora_rank", 0), _int(c, "kv_lora_rank")
    nope, rope, v = _int(c, "qk_nope_head_dim"), _int(c, "qk_rope_head_dim"), \
        _int(c, "v_head_dim")
    q_out = heads * (nope + rope)
    # The down-projections into the Q and KV latents serve every head: tensor-parallel engines
    # (vLLM's and SGLang's ReplicatedLinear) keep them whole on each rank.
    latent = Weights("attention", hidden * (q_rank + kv_rank + rope), q_rank + kv_rank + rope,
                     replicated=True)
    up = q_rank * q_out if q_rank else hidden * q_out
    attention = Weights("attention", up + kv_rank * heads * (nope + v) + heads * v * hidden,
                        q_out + heads * (nope + v) + hidden)
    latent_norms = Weights("norms", q_rank + kv_rank, kind="other", replicated=True)
    act = q_rank + q_out + kv_rank + rope + heads * (nope + v) + heads * v
    experts, top_k = _int(c, "n_routed_experts"), _int(c, "num_experts_per_tok")
    shared, moe_inter = _int(c, "n_shared_experts", 0), _int(c, "moe_intermediate_size")
    dense_layers, inter = _int(c, "first_k_dense_replace", 0), _int(c, "intermediate_size")
    kv = LayerKV(kv_rank + rope, 0)  # one latent for all heads: every TP rank keeps it whole
    shaped = []
    for i in range(layers):
        if i < dense_layers:
            mlp, width = (_mlp("mlp", hidden, inter),), 3 * inter
        else:
            mlp = (_mlp("routed_experts", hidden, moe_inter, _stored(c, experts)),
                   _mlp("shared_experts", hidden, moe_inter, shared),
                   Weights("router", experts * hidden + experts, kind="other", replicated=True,
                           fixed=ROUTER_DTYPE))
            width = 3 * (top_k + shared) * moe_inter + experts
        shaped.append(Layer((latent, attention, *mlp, latent_norms, _norms(hidden)), kv,
                            act + width))
    head, tail = _ends(c, hidden, _int(c, "vocab_size"), bool(c.get("tie_embeddings")))
    return ModelShape("deepseek_v3", hidden, _int(c, "vocab_size"), head, tuple(shaped), tail)


def bert(c: Mapping) -> ModelShape:
    """BERT encoder (biases and LayerNorms included, pooler excluded as the node loads it)."""
    hidden, inter, layers = _int(c, "hidden_size"), _int(c, "intermediate_size"), \
        _int(c, "num_layers")
    vocab, positions = _int(c, "vocab_size"), _int(c, "max_position", 512)
    head = (Weights("embed", vocab * hidden, vocab, "embeddings"),
            Weights("embed", (positions + 2) * hidden + 2 * hidden, kind="other"))
    layer = Layer((Weights("attention", 4 * hidden * hidden + 4 * hidden, 4 * hidden),
                   Weights("mlp", 2 * hidden * inter + inter + hidden, inter + hidden),
                   Weights("norms", 4 * hidden, kind="other", replicated=True)),
                  None, 4 * hidden + inter)
    return ModelShape("bert", hidden, vocab, head, (layer,) * layers, ())


ARCHITECTURES: dict[str, Callable[[Mapping], ModelShape]] = {
    "llama": llama, "llama4_moe": llama4_moe, "deepseek_v3": deepseek_v3, "bert": bert}


def shape(architecture: str, config: Mapping) -> ModelShape:
    formula = ARCHITECTURES.get(architecture)
    if formula is None:
        raise PlanningError(f"the planner has no formula for architecture {architecture!r} "
                            f"(known: {', '.join(ARCHITECTURES)})", field="architecture")
    return formula(config)
