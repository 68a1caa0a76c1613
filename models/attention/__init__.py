"""Paged attention: per-step metadata and the backends that read K/V through block tables."""

from edgefire.models.attention.backend import AttentionBackend
from edgefire.models.attention.metadata import (
    AttentionMetadata,
    PrefillSpan,
    micro_batches,
    split_decodes,
)
from edgefire.models.attention.torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "AttentionMetadata", "PrefillSpan", "TorchPagedAttention",
           "micro_batches", "split_decodes"]
