"""The node plugin: a lossless zlib weight codec and a KV backend that counts allocations."""

from __future__ import annotations

import zlib

import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.kv_pool import KVPool
from edgefire.runtime.plugins import hookimpl

calls = {"encode": 0, "decode": 0, "allocate": 0}


class ZlibCodec:
    name = "dummy_zlib"

    def encode(self, tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, bytes]:
        calls["encode"] += 1
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        return tuple(tensor.shape), tensor.dtype, zlib.compress(raw, 1)

    def decode(self, encoded: tuple[tuple[int, ...], torch.dtype, bytes]) -> torch.Tensor:
        calls["decode"] += 1
        shape, dtype, blob = encoded
        data = bytearray(zlib.decompress(blob))
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


class CountingBlockManager(BlockManager):
    def allocate(self, seq, num_new_tokens, cached=()):
        calls["allocate"] += 1
        return super().allocate(seq, num_new_tokens, cached)


def create_counting_pool(num_blocks, block_size, cache_shape, dtype, enable_prefix_caching):
    return KVPool(CountingBlockManager(num_blocks, block_size, enable_prefix_caching),
                  torch.zeros(cache_shape, dtype=dtype))


@hookimpl
def edgefire_register_codecs(register):
    register("dummy_zlib", ZlibCodec)


@hookimpl
def edgefire_register_kv_backends(register):
    register("dummy_counting", create_counting_pool)
