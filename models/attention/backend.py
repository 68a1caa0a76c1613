"""The attention backend contract; a Triton/GPU kernel implements the same Protocol."""

from __future__ import annotations

from typing import Protocol

import torch

from edgefire.models.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_kv_heads, num_blocks, block_size, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        """Store k/v at meta.slot_mapping, then attend each query to its sequence's cache."""
        ...
