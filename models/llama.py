"""Llama decoder (GQA, RoPE, RMSNorm, SwiGLU, tied embeddings) over paged attention.

Loads SmolLM2 and other Llama-family GGUF files. Q/K and gate/up projections are fused into
one matmul each, which matters at decode batch sizes where per-op overhead dominates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from edgefire.models.attention import (
    AttentionBackend,
    AttentionMetadata,
    TorchPagedAttention,
    split_decodes,
)
from edgefire.models.fused import FusedLlamaDecode
from edgefire.models.precision import dense_precision, per_dtype, storage_bytes
from edgefire.models.rotary import RotaryEmbedding
from edgefire.models.row_buckets import blocked_linear, dense_linear


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position: int
    tie_embeddings: bool = True

    @classmethod
    def from_gguf_fields(cls, field) -> LlamaConfig:
        """Build from a GGUF metadata getter (`field(key, default)`)."""
        arch = field("general.architecture")
        hidden = int(field(f"{arch}.embedding_length"))
        heads = int(field(f"{arch}.attention.head_count"))
        return cls(
            vocab_size=int(field(f"{arch}.vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(field(f"{arch}.feed_forward_length")),
            num_layers=int(field(f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=int(field(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(field(f"{arch}.rope.dimension_count", hidden // heads)),
            rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            max_position=int(field(f"{arch}.context_length")),
        )


class ResidentLinear(Protocol):
    """A projection weight kept in another form than a dense tensor (packed, quantized)."""

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T in x's dtype."""
        ...

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors it holds, so that weight_bytes can count them."""
        ...


Projection = torch.Tensor | ResidentLinear
PROJECTIONS = ("qkv", "o", "gate_up", "down")


def _linear(x: torch.Tensor, w: Projection, row_block: int | None = None) -> torch.Tensor:
    if row_block is not None:
        return blocked_linear(x, (lambda b: F.linear(b, w)) if isinstance(w, torch.Tensor)
                              else w.linear, row_block)
    return dense_linear(x, w) if isinstance(w, torch.Tensor) else w.linear(x)


@dataclass(slots=True)
class LlamaLayer:
    attn_norm: torch.Tensor
    qkv: Projection  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: Projection
    mlp_norm: torch.Tensor
    gate_up: Projection  # [2 * intermediate, hidden]
    down: Projection


@dataclass(slots=True)
class LlamaWeights:
    """The whole model's weights in one compute dtype."""

    embed: torch.Tensor | ResidentLinear  # resident: also offers rows(ids, dtype)
    final_norm: torch.Tensor
    lm_head: Projection
    layers: list[LlamaLayer]
    rotary: RotaryEmbedding

    @classmethod
    def build(cls, config: LlamaConfig, weights: dict[str, torch.Tensor],
              dtype: torch.dtype) -> LlamaWeights:
        embed = weights["embed"].to(dtype)
        layers = [
            LlamaLayer(*(weights[f"layers.{i}.{name}"].to(dtype) for name in LlamaLayer.__slots__))
            for i in range(config.num_layers)
        ]
        lm_head = embed if config.tie_embeddings else weights["lm_head"].to(dtype)
        rotary = RotaryEmbedding(config.head_dim, config.max_position, config.rope_theta)
        return cls(embed, weights["final_norm"].to(dtype), lm_head, layers, rotary.to(dtype))


@dataclass(slots=True)
class TensorShard:
    """What a tensor-parallel rank's model adds to its forward pass (models/tensor_parallel):
    the sum over ranks of its partial outputs, and the vocabulary rows it holds."""

    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    vocab: range = field(default_factory=lambda: range(0))


class PagedGQADecoder:
    """What a grouped-query decoder over the paged cache keeps beside its weights (Llama and
    Llama 4): the compute dtypes, the attention backend and the K/V page layout."""

    config: LlamaConfig  # or a config with the same attention fields (Llama4Config)

    def _paged_gqa(self, c, dtypes: tuple[torch.dtype, ...], kv_dtype: torch.dtype | None,
                   attention: AttentionBackend | None) -> None:
        self.dtypes = dtypes
        self.kv_dtype = kv_dtype or dtypes[0]
        self.attention = attention or TorchPagedAttention(c.num_heads, c.num_kv_heads, c.head_dim)
        self.q_size = c.num_heads * c.head_dim
        self.kv_size = c.num_kv_heads * c.head_dim
        self.weight_precision = dense_precision(dtypes)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        c = self.config
        return (c.num_layers, 2, c.num_kv_heads, num_blocks, block_size, c.head_dim)


class LlamaForCausalLM(PagedGQADecoder):
    """Forward pass over a packed batch of tokens; K/V live in a paged cache owned by the runner.

    Weights may be held in several compute dtypes (float32 and bfloat16 on CPU): the caller picks
    one per step, since on CPU the faster dtype depends on how many tokens the step carries.
    """

    def __init__(self, config: LlamaConfig,
                 weights: dict[str, torch.Tensor] | dict[torch.dtype, dict[str, torch.Tensor]],
                 dtypes: tuple[torch.dtype, ...], kv_dtype: torch.dtype | None = None,
                 attention: AttentionBackend | None = None) -> None:
        """weights: one dict cast to each dtype, or one dict per dtype already in it (a warm
        cache's memory-mapped tensors, which build() then keeps as they are: `.to` is a no-op)."""
        self.config = config
        c = config
        held = per_dtype(weights, dtypes)
        self.params = {dtype: LlamaWeights.build(c, held[dtype], dtype) for dtype in dtypes}
        self._paged_gqa(c, dtypes, kv_dtype, attention)
        # Small BF16 decode steps run as one native call (models/fused) where the weights and
        # the CPU allow it; benches turn it off to measure the torch path beside it.
        self.fused_decode = True
        self._fused: FusedLlamaDecode | None = None
        self._fused_built = False
        self.shard: TensorShard | None = None  # a tensor-parallel rank's (tensor_parallel.py)

    def batch_invariant_decode_rows(self, dtype: torch.dtype) -> int:
        """How many decode rows a step of this dtype computes each independently of the others
        (bit for bit): the fused step's, or none. Speculative decoding verifies drafts only
        within this, so its output (greedy, or sampled with the same draws) is exactly that of
        one-token steps."""
        fused = self._fused_step()
        return fused.max_rows if fused is not None and dtype == torch.bfloat16 else 0

    def fused_prompts(self, dtype: torch.dtype) -> bool:
        """Whether a step of this dtype computes its prompt chunks, whatever their length, in
        one native step with up to batch_invariant_decode_rows decodes (models/fused)."""
        fused = self._fused_step()
        return fused is not None and fused.takes_prompts and dtype == torch.bfloat16

    def _fused_step(self) -> FusedLlamaDecode | None:
        if not self._fused_built:
            self._fused_built = True
            bf16 = self.params.get(torch.bfloat16)
            self._fused = None if bf16 is None else FusedLlamaDecode.build(self.config, bf16)
        return self._fused if self.fused_decode else None

    def make_resident(self, to_resident: Callable[[torch.Tensor], ResidentLinear],
                      precision: str,
                      to_resident_embedding: Callable[[torch.Tensor], ResidentLinear] | None = None,
                      ) -> None:
        """Replace every layer's projections with to_resident's form (a weight codec's packed
        or quantized one); with `to_resident_embedding` the embedding table and lm_head too, in
        that form, which must then offer `rows(ids, dtype)`. Norms stay dense. One resident
        object serves every compute dtype, built from the widest copy, and the dense copies
        are released."""
        widest = self.params[max(self.dtypes, key=lambda d: d.itemsize)]
        for i, layer in enumerate(widest.layers):
            for name in PROJECTIONS:
                resident = to_resident(getattr(layer, name))
                for w in self.params.values():
                    setattr(w.layers[i], name, resident)
        if to_resident_embedding is not None:
            embed = to_resident_embedding(widest.embed)
            lm_head = (embed if self.config.tie_embeddings
                       else to_resident_embedding(widest.lm_head))
            for w in self.params.values():
                w.embed, w.lm_head = embed, lm_head
        self.weight_precision = precision
        self._fused, self._fused_built = None, False  # built again over the new forms

    @property
    def weight_bytes(self) -> int:
        held = [item for w in self.params.values() for item in (
            w.embed, w.final_norm, w.lm_head,
            *(getattr(layer, f) for layer in w.layers for f in LlamaLayer.__slots__))]
        return storage_bytes(t for item in held
                             for t in ((item,) if isinstance(item, torch.Tensor)
                                       else item.tensors()))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor, dtype: torch.dtype | None = None,
                row_block: int | None = None) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm, in `dtype`; with row_block,
        every projection runs in blocks of that many rows (batch-invariant, deterministic mode).
        """
        dtype = dtype or self.dtypes[0]
        fused = self._fused_step()
        if fused is not None:
            if fused.takes(input_ids.shape[0], meta, kv_cache, dtype, row_block):
                return fused.forward(input_ids, positions, meta, kv_cache)
            n = meta.num_decode_tokens
            if n and meta.prefills:
                decodes, prompts = split_decodes(meta)
                if fused.takes(n, decodes, kv_cache, dtype, row_block):
                    # A step that adds prompt chunks to the decodes: the decodes still take
                    # the fused step (their rows are computed as in any other step), the
                    # chunks torch's GEMM. Serving at 16 clients, most steps are such.
                    head = fused.forward(input_ids[:n], positions[:n], decodes, kv_cache)
                    tail = self._forward_torch(input_ids[n:], positions[n:], prompts, kv_cache,
                                               dtype, row_block)
                    return torch.cat([head, tail])
        return self._forward_torch(input_ids, positions, meta, kv_cache, dtype, row_block)

    def _forward_torch(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       meta: AttentionMetadata, kv_cache: torch.Tensor, dtype: torch.dtype,
                       row_block: int | None) -> torch.Tensor:
        h = self.embed_tokens(input_ids, dtype)
        h = self.run_layers(h, positions, meta, kv_cache, dtype, row_block)
        return self.final_norm(h)

    # A pipeline stage runs a part of these (models/pipeline_parallel.py): the first embeds,
    # every stage runs its layers on the residual stream, the last normalises it.
    def embed_tokens(self, input_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The residual stream's first value: each token's embedding row, in dtype."""
        return self._embed(input_ids, self.params[dtype], dtype)

    def run_layers(self, h: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                   kv_cache: torch.Tensor, dtype: torch.dtype, row_block: int | None = None,
                   layers: range | None = None) -> torch.Tensor:
        """The residual stream h after every layer this model holds (kv_cache: theirs), or
        after those in `layers` alone."""
        c = self.config
        w = self.params[dtype]
        eps = c.rms_norm_eps
        n = h.shape[0]
        for i in layers or range(len(w.layers)):
            layer = w.layers[i]
            x = F.rms_norm(h, (c.hidden_size,), layer.attn_norm, eps)
            qkv = _linear(x, layer.qkv, row_block)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], -1)
            q, k = w.rotary(positions, q.view(n, c.num_heads, c.head_dim),
                            k.view(n, c.num_kv_heads, c.head_dim))
            attn = self.attention.forward(q, k, v.view(n, c.num_kv_heads, c.head_dim),
                                          kv_cache[i], meta)
            h = h + self._reduced(_linear(attn, layer.o, row_block))
            x = F.rms_norm(h, (c.hidden_size,), layer.mlp_norm, eps)
            gate, up = _linear(x, layer.gate_up, row_block).chunk(2, dim=-1)
            h = h + self._reduced(_linear(F.silu(gate) * up, layer.down, row_block))
        return h

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden states the LM head reads: the residual stream after the final norm."""
        return F.rms_norm(h, (self.config.hidden_size,), self.params[h.dtype].final_norm,
                          self.config.rms_norm_eps)

    def _embed(self, input_ids: torch.Tensor, w: LlamaWeights, dtype: torch.dtype
               ) -> torch.Tensor:
        if self.shard is not None:
            # A rank holds the rows of its vocabulary slice: the others' tokens read as zeros
            # and the all-reduce brings each row from the rank that holds it.
            vocab = self.shard.vocab
            local = input_ids - vocab.start
            held = (local >= 0) & (local < len(vocab))
            rows = F.embedding(local.clamp(0, len(vocab) - 1), w.embed) * held[:, None]
            return self.shard.all_reduce(rows)
        return (F.embedding(input_ids, w.embed) if isinstance(w.embed, torch.Tensor)
                else w.embed.rows(input_ids, dtype))

    def _reduced(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel projection's output summed over the ranks (as it is on one)."""
        return partial if self.shard is None else self.shard.all_reduce(partial)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, row_block: int | None = None) -> torch.Tensor:
        """Float32 logits [rows, vocab], using the lm_head of hidden's dtype (a tensor-parallel
        rank's: the columns of its vocabulary slice)."""
        fused = self._fused_step()
        if fused is not None and hidden.dtype == torch.bfloat16 and row_block is None:
            logits = fused.logits(hidden)
            if logits is not None:
                return logits
        return _linear(hidden, self.params[hidden.dtype].lm_head, row_block).float()


_GGUF_NAMES = {
    "attn_norm": "attn_norm", "ffn_norm": "mlp_norm", "attn_output": "o", "ffn_down": "down",
}


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    # llama.cpp's converter interleaves Q/K rows for its RoPE layout; undo it for rotate-half.
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def weights_from_gguf(config: LlamaConfig,
                      tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Map GGUF tensor names to this module's (fused) weights."""
    raw = dict(tensors)
    out = {"embed": raw.pop("token_embd.weight"), "final_norm": raw.pop("output_norm.weight")}
    if "output.weight" in raw:
        out["lm_head"] = raw.pop("output.weight")
    for i in range(config.num_layers):
        p = f"blk.{i}."
        q = _unpermute(raw.pop(p + "attn_q.weight"), config.num_heads)
        k = _unpermute(raw.pop(p + "attn_k.weight"), config.num_kv_heads)
        out[f"layers.{i}.qkv"] = torch.cat([q, k, raw.pop(p + "attn_v.weight")])
        out[f"layers.{i}.gate_up"] = torch.cat([raw.pop(p + "ffn_gate.weight"),
                                                raw.pop(p + "ffn_up.weight")])
        for gguf_name, name in _GGUF_NAMES.items():
            out[f"layers.{i}.{name}"] = raw.pop(f"{p}{gguf_name}.weight")
    return out
