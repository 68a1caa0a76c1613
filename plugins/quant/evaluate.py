"""Loading a model with a quantizing codec, and measuring what the quantization costs in quality."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from edgefire.contract.catalog import ModelSpec
from edgefire.models.attention import AttentionMetadata, PrefillSpan
from edgefire.runtime.engine.precision import Precision
from edgefire.runtime.loading import LoadedLM, load_lm


def load_with_codec(spec: ModelSpec, codec_name: str, precision: Precision) -> LoadedLM:
    """spec loaded through `codec_name` (a quantizing codec's projections stay packed)."""
    return load_lm(dataclasses.replace(spec, codec=codec_name), precision)


@torch.inference_mode()
def perplexity(model, token_ids: list[int], window: int = 512, block_size: int = 16,
               dtype: torch.dtype | None = None) -> float:
    """exp(mean next-token NLL), teacher-forced over non-overlapping windows of the text.

    Each window is one prefill through the model's own forward and paged attention, so it
    measures exactly what the engine computes.
    """
    blocks = math.ceil(window / block_size)
    kv_cache = torch.zeros(model.kv_cache_shape(blocks, block_size), dtype=model.kv_dtype)
    total, count = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        ids = torch.tensor(token_ids[start:start + window + 1])
        inputs, targets = ids[:-1], ids[1:]
        n = len(inputs)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n), num_decode_tokens=0,
            decode_block_tables=torch.zeros(0, 0, dtype=torch.long),
            decode_context_lens=torch.zeros(0, dtype=torch.long),
            decode_mask=torch.zeros(1, 0, 1, 0, dtype=torch.bool),
            prefills=[PrefillSpan(0, n, n, torch.arange(blocks), None)])
        hidden = model.forward(inputs, torch.arange(n), meta, kv_cache, dtype)
        logits = model.compute_logits(hidden)
        total += F.cross_entropy(logits, targets, reduction="sum").item()
        count += n
    return math.exp(total / count)
