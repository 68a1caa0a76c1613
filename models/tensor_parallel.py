"""A tensor-parallel rank's shard of a Llama model (Megatron-LM's split).

QKV and gate/up are column-parallel: a rank holds the Q heads of its KV heads, those KV heads
(its paged KV cache holds only them) and a slice of the MLP's channels, and computes them
without talking to the others. o_proj and down are row-parallel: each rank's output is a
partial sum, and one all-reduce after attention and one after the MLP make it whole. The
embedding and the LM head are split by vocabulary: a token's row comes from the rank holding
it (an all-reduce of the looked-up rows), and each rank computes its slice of the logits,
which the root gathers (runtime/parallel). Split by vocabulary rather than kept whole on the
root, the LM head, a fifth of SmolLM2's weight bytes, is read half by each of two ranks; the
gather costs 4 bytes a logit, small next to the head's reads at decode sizes.

Heads split by whole KV groups, unevenly where they must: SmolLM2's 3 KV heads (9 query
heads) go 2 and 1 over two ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from edgefire.models.llama import LlamaConfig, LlamaForCausalLM, TensorShard


def split(n: int, world_size: int, rank: int) -> range:
    """Rank's part of n items over world_size ranks, the first ranks taking one more where n
    does not divide."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def shard_llama(model: LlamaForCausalLM, rank: int, world_size: int,
                all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> LlamaForCausalLM:
    """Rank's shard of model, its weights sliced (copied), calling all_reduce where the
    ranks' partial sums meet. Raises ValueError where the model cannot be split so."""
    c = model.config
    if c.num_kv_heads < world_size:
        raise ValueError(f"{c.num_kv_heads} KV heads cannot be split over {world_size} ranks")
    kv = split(c.num_kv_heads, world_size, rank)
    group = c.num_heads // c.num_kv_heads
    heads = range(kv.start * group, kv.stop * group)
    channels = split(c.intermediate_size, world_size, rank)
    vocab = split(c.vocab_size, world_size, rank)
    config = replace(c, num_heads=len(heads), num_kv_heads=len(kv),
                     intermediate_size=len(channels))
    weights = {dtype: _shard_weights(c, model.params[dtype], heads, kv, channels, vocab)
               for dtype in model.dtypes}
    shard = LlamaForCausalLM(config, weights, model.dtypes, model.kv_dtype)
    # The fused native step has no collectives between its layers: ranks run torch's.
    shard.fused_decode = False
    shard.shard = TensorShard(all_reduce, vocab)
    return shard


def _rows(w: torch.Tensor, *spans: range) -> torch.Tensor:
    return torch.cat([w[s.start:s.stop] for s in spans]).contiguous()


def _shard_weights(c: LlamaConfig, w, heads: range, kv: range, channels: range,
                   vocab: range) -> dict[str, torch.Tensor]:
    hd = c.head_dim
    q_size, kv_size = c.num_heads * hd, c.num_kv_heads * hd

    def dims(r: range, offset: int = 0) -> range:  # a head range as rows of hd each
        return range(offset + r.start * hd, offset + r.stop * hd)

    out = {"final_norm": w.final_norm}
    for name, table in (("embed", w.embed), ("lm_head", w.lm_head)):
        if not isinstance(table, torch.Tensor):
            raise ValueError("tensor parallelism needs dense weights; this model holds them "
                             "in a codec's resident form")
        out[name] = _rows(table, vocab)
    for i, layer in enumerate(w.layers):
        dense = (layer.qkv, layer.o, layer.gate_up, layer.down)
        if not all(isinstance(t, torch.Tensor) for t in dense):
            raise ValueError("tensor parallelism needs dense weights; this model holds them "
                             "in a codec's resident form")
        p = f"layers.{i}."
        out[p + "attn_norm"] = layer.attn_norm
        out[p + "mlp_norm"] = layer.mlp_norm
        out[p + "qkv"] = _rows(layer.qkv, dims(heads), dims(kv, q_size),
                               dims(kv, q_size + kv_size))
        out[p + "o"] = _rows(layer.o.t(), dims(heads)).t().contiguous()
        inter = c.intermediate_size
        out[p + "gate_up"] = _rows(layer.gate_up, channels,
                                   range(inter + channels.start, inter + channels.stop))
        out[p + "down"] = _rows(layer.down.t(), channels).t().contiguous()
    return out
