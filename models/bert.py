"""BERT-style encoder (all-MiniLM-L6-v2 and kin) in plain torch, plus sentence pooling.

Post-LayerNorm blocks as in the original BERT: attention and MLP each add their residual and
then normalise. Q/K/V are fused into one matmul; attention is torch's SDPA with a padding mask.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from edgefire.models.precision import dense_precision


def _gelu(approximate: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """GELU by ATen's own kernel, never oneDNN's.

    torch hands a contiguous float32 GELU to oneDNN, which builds (JIT-compiles) and caches one
    primitive per tensor shape, up to 1,024 of them. An encoder sees a new [batch, length] shape
    with almost every request, so the node's memory grew by hundreds of MiB under embeddings
    load (README, soak). ATen takes any input that is not contiguous, and is as fast here:
    the transposed view of the same rows is such an input, and its result, laid out like the
    input, transposes back without a copy.
    """
    def gelu(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return F.gelu(rows.T, approximate=approximate).T.view(x.shape)
    return gelu


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": _gelu("none"),  # HF's "gelu" is the exact erf form, not the tanh approximation
    "gelu_new": _gelu("tanh"),
    "gelu_pytorch_tanh": _gelu("tanh"),
    "relu": F.relu,
}


@dataclass(slots=True, frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, raw: dict) -> BertConfig:
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported position_embedding_type "
                             f"{raw['position_embedding_type']!r}; only 'absolute' is")
        act = raw.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {act!r}; known: {', '.join(_ACTIVATIONS)}")
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position=int(raw["max_position_embeddings"]),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=act,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(slots=True)
class BertLayer:
    qkv_w: torch.Tensor  # [3 * hidden, hidden]: query, key, value rows stacked
    qkv_b: torch.Tensor
    attn_out_w: torch.Tensor
    attn_out_b: torch.Tensor
    attn_norm_w: torch.Tensor
    attn_norm_b: torch.Tensor
    up_w: torch.Tensor  # [intermediate, hidden]
    up_b: torch.Tensor
    down_w: torch.Tensor  # [hidden, intermediate]
    down_b: torch.Tensor
    mlp_norm_w: torch.Tensor
    mlp_norm_b: torch.Tensor


@dataclass(slots=True)
class BertWeights:
    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor
    embed_norm_w: torch.Tensor
    embed_norm_b: torch.Tensor
    layers: list[BertLayer]

    def tensors(self) -> list[torch.Tensor]:
        top = [self.word, self.position, self.token_type, self.embed_norm_w, self.embed_norm_b]
        return top + [getattr(layer, name) for layer in self.layers
                      for name in BertLayer.__slots__]


# Checkpoint names (after any `bert.` prefix is stripped) of each BertLayer field; q/k/v are
# concatenated into the fused projection separately.
_LAYER_NAMES = {
    "attn_out_w": "attention.output.dense.weight",
    "attn_out_b": "attention.output.dense.bias",
    "attn_norm_w": "attention.output.LayerNorm.weight",
    "attn_norm_b": "attention.output.LayerNorm.bias",
    "up_w": "intermediate.dense.weight",
    "up_b": "intermediate.dense.bias",
    "down_w": "output.dense.weight",
    "down_b": "output.dense.bias",
    "mlp_norm_w": "output.LayerNorm.weight",
    "mlp_norm_b": "output.LayerNorm.bias",
}


def weights_from_checkpoint(config: BertConfig, tensors: Iterable[tuple[str, torch.Tensor]],
                            dtype: torch.dtype = torch.float32) -> BertWeights:
    """Map HF BertModel tensor names (with or without a `bert.` prefix) to BertWeights.

    Tensors the encoder does not use (pooler, position_ids buffer, MLM heads) are dropped.
    """
    named = {name.removeprefix("bert."): tensor for name, tensor in tensors}

    def take(name: str) -> torch.Tensor:
        if name not in named:
            raise ValueError(f"BERT checkpoint has no tensor {name!r}")
        return named[name].to(dtype).contiguous()

    layers = []
    for i in range(config.num_layers):
        prefix = f"encoder.layer.{i}."
        qkv = [take(f"{prefix}attention.self.{part}.{kind}")
               for kind in ("weight", "bias") for part in ("query", "key", "value")]
        layers.append(BertLayer(
            qkv_w=torch.cat(qkv[:3]), qkv_b=torch.cat(qkv[3:]),
            **{field: take(prefix + name) for field, name in _LAYER_NAMES.items()}))
    weights = BertWeights(
        word=take("embeddings.word_embeddings.weight"),
        position=take("embeddings.position_embeddings.weight"),
        token_type=take("embeddings.token_type_embeddings.weight"),
        embed_norm_w=take("embeddings.LayerNorm.weight"),
        embed_norm_b=take("embeddings.LayerNorm.bias"),
        layers=layers)
    expected = (config.vocab_size, config.hidden_size)
    if tuple(weights.word.shape) != expected:
        raise ValueError(f"word embeddings are {tuple(weights.word.shape)}, config says "
                         f"{expected}")
    return weights


class BertEncoder:
    """Inference-only encoder; `dtype` is the compute dtype of every weight and activation."""

    def __init__(self, config: BertConfig, weights: BertWeights,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config = config
        self.dtype = dtype
        self.weights = weights
        self.weight_precision = dense_precision([dtype])
        self._act = _ACTIVATIONS[config.hidden_act]

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.tensors())

    @torch.inference_mode()
    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings [B, H]: mean-pooled, L2-normalised, in float32."""
        hidden = self.encode(input_ids, attention_mask)
        return mean_pool(hidden.float(), attention_mask)

    @torch.inference_mode()
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden states [B, T, H] for right- or left-padded ids [B, T] (mask 1 = token)."""
        cfg, w = self.config, self.weights
        batch, length = input_ids.shape
        assert length <= cfg.max_position, "caller truncates to the model's positions"
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(length, device=input_ids.device)
        x = w.word[input_ids] + w.position[positions] + w.token_type[token_type_ids]
        x = F.layer_norm(x, (cfg.hidden_size,), w.embed_norm_w, w.embed_norm_b,
                         cfg.layer_norm_eps)
        # [B, 1, 1, T] boolean: every query may attend to every real key of its own sequence.
        # Padding queries still see the real keys, so no row is fully masked (no NaNs).
        mask = attention_mask.bool()[:, None, None, :]
        for layer in w.layers:
            x = self._layer(layer, x, mask, batch, length)
        return x

    def _layer(self, layer: BertLayer, x: torch.Tensor, mask: torch.Tensor,
               batch: int, length: int) -> torch.Tensor:
        cfg = self.config
        hidden = cfg.hidden_size
        qkv = F.linear(x, layer.qkv_w, layer.qkv_b)
        qkv = qkv.view(batch, length, 3, cfg.num_heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        attn = attn.transpose(1, 2).reshape(batch, length, hidden)
        x = F.layer_norm(x + F.linear(attn, layer.attn_out_w, layer.attn_out_b), (hidden,),
                         layer.attn_norm_w, layer.attn_norm_b, cfg.layer_norm_eps)
        up = self._act(F.linear(x, layer.up_w, layer.up_b))
        return F.layer_norm(x + F.linear(up, layer.down_w, layer.down_b), (hidden,),
                            layer.mlp_norm_w, layer.mlp_norm_b, cfg.layer_norm_eps)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor,
              normalize: bool = True) -> torch.Tensor:
    """sentence-transformers pooling: mean over real tokens, then (by default) L2 norm."""
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * mask).sum(dim=1)
    # Same clamp as sentence-transformers, so an all-padding row gives zeros, not NaN.
    pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2.0, dim=-1) if normalize else pooled
