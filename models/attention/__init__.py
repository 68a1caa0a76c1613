"""Paged attention: per-step metadata and the backends that read K/V through block tables."""

from models.attention.backend import AttentionBackend
from models.attention.metadata import AttentionMetadata, PrefillSpan
from models.attention.torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "AttentionMetadata", "PrefillSpan", "TorchPagedAttention"]
