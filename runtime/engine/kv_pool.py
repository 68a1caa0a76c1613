"""The KV pool a backend provides: block bookkeeping plus the page storage it indexes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.remote_kv.codec import IDENTITY, KVCodec
from edgefire.runtime.engine.remote_kv.store import PageStore


@dataclass(slots=True)
class KVPool:
    blocks: BlockManager
    cache: torch.Tensor  # [layers, 2, kv_heads, num_blocks, block_size, head_dim]
    # A shared store behind the pool (the `redis` backend): the engine puts a remote tier
    # (runtime/engine/remote_kv/tier.py) between the two.
    store: PageStore | None = None
    codec: KVCodec = IDENTITY  # how the store keeps a page's bytes


class KVBackendFactory(Protocol):
    def __call__(self, num_blocks: int, block_size: int, cache_shape: tuple[int, ...],
                 dtype: torch.dtype, enable_prefix_caching: bool) -> KVPool: ...
