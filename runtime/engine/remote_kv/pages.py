"""Pages between a pool and their records: gathered out, checked, installed as cached blocks.

Both ways of moving KV between nodes use these: a KV store (remote_kv/tier.py) and a prefill
node answering a decode node directly over HTTP (runtime/server/prefill.py).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.remote_kv.codec import IDENTITY, KVCodec
from edgefire.runtime.engine.remote_kv.page_format import PageFormatError, PageLayout, pack, unpack

log = logging.getLogger(__name__)

Page = tuple[bytes, bytearray | memoryview]  # (chain hash, payload: maybe a record's bytes)


def gather(cache: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """Pages `ids` of the pool [layers, 2, heads, blocks, block, dim] as a plain array
    [n, layers, 2, heads, block, dim]; 16-bit floats travel as their bits (numpy has no
    bfloat16)."""
    pages = cache.index_select(3, ids).movedim(3, 0).contiguous()
    if pages.dtype.itemsize == 2 and pages.dtype.is_floating_point:
        pages = pages.view(torch.int16)
    return pages.numpy()


def page_bytes(page: np.ndarray) -> memoryview:
    return memoryview(page).cast("B")


def accept(layout: PageLayout, hashes: list[bytes], records: list[bytes | None],
           codec: KVCodec = IDENTITY) -> tuple[list[Page], int]:
    """The leading records that are whole pages of `hashes` in order, as `codec` wrote them,
    and how many were refused (0 or 1: a refused page ends the run, the rest is
    recomputed)."""
    pages: list[Page] = []
    for block_hash, record in zip(hashes, records, strict=False):
        if record is None:
            break
        try:
            name, payload = unpack(record, layout, block_hash)
            if name != codec.name:
                raise PageFormatError(f"written by KV codec {name!r}, this node reads "
                                      f"{codec.name!r}")
            page = codec.decode(payload, layout)
        except (PageFormatError, ValueError) as exc:
            log.warning("KV page %s refused (%s); recomputing from there",
                        block_hash.hex()[:16], exc)
            return pages, 1
        pages.append((block_hash, page))
    return pages, 0


def install(blocks: BlockManager, cache: torch.Tensor, layout: PageLayout,
            pages: list[Page]) -> int:
    """Put pages into free blocks as cached blocks; returns how many went in. At most the
    pool's free blocks are taken, so a page never evicts another of the same run; a page
    whose block the pool already caches is skipped."""
    num_installed = 0
    for block_hash, payload in pages[:blocks.num_free_blocks]:
        block_id = blocks.adopt(block_hash)
        if block_id is None:
            continue
        _copy_page(cache[:, :, :, block_id], payload, layout)
        num_installed += 1
    return num_installed


def export(blocks: BlockManager, cache: torch.Tensor, layout: PageLayout,
           hashes: list[bytes]) -> list[bytes]:
    """Records of the longest run of `hashes` the pool caches."""
    ids: list[int] = []
    for block_hash in hashes:
        block_id = blocks.cached.get(block_hash)
        if block_id is None:
            break
        ids.append(block_id)
    if not ids:
        return []
    pages = gather(cache, torch.tensor(ids))
    return [pack(layout, h, page_bytes(pages[i]), IDENTITY.name)
            for i, h in enumerate(hashes[:len(ids)])]


def _copy_page(slot: torch.Tensor, payload: bytearray | memoryview, layout: PageLayout) -> None:
    """Copy a page's bytes into its block of the pool. Through numpy: a payload may be a
    read-only view of a record, which numpy reads as it is, where torch.frombuffer warns that
    its tensor could write to it."""
    if layout.dtype.itemsize == 2:  # numpy has no bfloat16: the bits travel as int16
        slot = slot.view(torch.int16)
    target = slot.numpy()
    np.copyto(target, np.frombuffer(payload, dtype=target.dtype).reshape(layout.shape))
