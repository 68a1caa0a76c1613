"""The KV pool a backend provides: block bookkeeping plus the page storage it indexes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from edgefire.runtime.engine.block_manager import BlockManager


@dataclass(slots=True)
class KVPool:
    blocks: BlockManager
    cache: torch.Tensor  # [layers, 2, kv_heads, num_blocks, block_size, head_dim]


class KVBackendFactory(Protocol):
    def __call__(self, num_blocks: int, block_size: int, cache_shape: tuple[int, ...],
                 dtype: torch.dtype, enable_prefix_caching: bool) -> KVPool: ...
