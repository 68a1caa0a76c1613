"""Built-in KV backend: the node's own preallocated page pool, in process memory."""

from __future__ import annotations

import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.kv_pool import KVPool
from edgefire.runtime.plugins import hookimpl


def create_local_paged_pool(num_blocks: int, block_size: int, cache_shape: tuple[int, ...],
                            dtype: torch.dtype, enable_prefix_caching: bool) -> KVPool:
    return KVPool(BlockManager(num_blocks, block_size, enable_prefix_caching),
                  torch.zeros(cache_shape, dtype=dtype))


@hookimpl
def edgefire_register_kv_backends(register):
    register("local_paged", create_local_paged_pool)
