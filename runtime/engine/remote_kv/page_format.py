"""One KV page (a full block of every layer's K and V) as bytes: a header, then the payload.

The same record travels to a KV store and from a prefill node to a decode node. The header
names what the payload is (dtype, shape, layer range, codec) and which block it is (its prefix
chain hash), and carries a checksum of the payload, so a reader can refuse a page that is
missing, truncated, damaged or of another layout, and recompute it instead of using it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import torch

MAGIC = b"EFKV"
FORMAT_VERSION = 2
_DTYPES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
_DTYPE_OF = {code: dtype for dtype, code in _DTYPES.items()}
# magic, version, dtype, number of dims, layer range [first, end), codec name length,
# block hash, payload CRC-32, payload length.
_HEAD = struct.Struct("<4sBBBHH B 32s I Q")
_DIM = struct.Struct("<I")


class PageFormatError(ValueError):
    """A record that is not a page of the expected layout; the page is recomputed."""


@dataclass(slots=True, frozen=True)
class PageLayout:
    """What every page of one engine's pool looks like: [layers, 2, kv_heads, block, head_dim]
    in `dtype` (the pool's [layers, 2, kv_heads, num_blocks, block, head_dim] less a block)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    first_layer: int = 0

    @classmethod
    def of_cache(cls, cache: torch.Tensor) -> PageLayout:
        shape = tuple(cache.shape)
        return cls(cache.dtype, shape[:3] + shape[4:])

    @property
    def num_bytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize

    @property
    def end_layer(self) -> int:
        return self.first_layer + self.shape[0]


def checksum(payload: bytes | memoryview) -> int:
    """CRC-32: it catches damage, not forgery (a writer that can forge a page could forge any
    checksum too; what keeps other tenants out is the keyed salt in the key). 5x faster here
    than BLAKE2b, measured on a lookup's 29 MB of pages: 7 vs 33 ms."""
    return zlib.crc32(payload)


def pack(layout: PageLayout, block_hash: bytes, payload: bytes | memoryview,
         codec: str = "identity") -> bytes:
    """The record of one page whose (encoded) bytes are `payload`."""
    name = codec.encode()
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, _DTYPES[layout.dtype], len(layout.shape),
                      layout.first_layer, layout.end_layer, len(name), block_hash,
                      checksum(payload), len(payload))
    dims = b"".join(_DIM.pack(d) for d in layout.shape)
    return b"".join((head, dims, name, payload))


def unpack(record: bytes | memoryview, layout: PageLayout, block_hash: bytes
           ) -> tuple[str, memoryview]:
    """(codec name, payload) of a record that is `block_hash`'s page in `layout`, whole and
    unchanged; PageFormatError otherwise."""
    view = memoryview(record)
    if len(view) < _HEAD.size:
        raise PageFormatError("truncated header")
    (magic, version, dtype, ndim, first, end, name_len, stored_hash, digest,
     length) = _HEAD.unpack_from(view)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise PageFormatError("not a KV page of this format version")
    if stored_hash != block_hash:
        raise PageFormatError("the page belongs to another block")
    offset = _HEAD.size + ndim * _DIM.size
    if len(view) < offset + name_len:
        raise PageFormatError("truncated header")
    shape = tuple(_DIM.unpack_from(view, _HEAD.size + i * _DIM.size)[0] for i in range(ndim))
    if (_DTYPE_OF.get(dtype), shape, first, end) != (layout.dtype, layout.shape,
                                                      layout.first_layer, layout.end_layer):
        raise PageFormatError("the page has another dtype, shape or layer range")
    codec = bytes(view[offset:offset + name_len]).decode()
    payload = view[offset + name_len:]
    if len(payload) != length:
        raise PageFormatError(f"payload is {len(payload)} bytes, the header says {length}")
    if checksum(payload) != digest:
        raise PageFormatError("payload checksum mismatch")
    return codec, payload
