"""Pages between a pool and records, without a store: accepted records go into free blocks
bit for bit, read from the records' own bytes."""

from __future__ import annotations

import pytest
import torch

from edgefire.runtime.engine.block_manager import BlockManager
from edgefire.runtime.engine.remote_kv.page_format import PageLayout, pack
from edgefire.runtime.engine.remote_kv.pages import accept, gather, install, page_bytes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_accepted_records_install_bit_for_bit_from_their_own_bytes(dtype):
    source = torch.randn(3, 2, 2, 6, 4, 16).to(dtype)  # [layers, 2, heads, blocks, block, dim]
    layout = PageLayout.of_cache(source)
    hashes = [bytes([i]) * 32 for i in range(3)]
    pages = gather(source, torch.tensor([4, 1, 5]))
    records = [pack(layout, h, page_bytes(pages[i])) for i, h in enumerate(hashes)]

    accepted, num_refused = accept(layout, hashes, records)
    assert num_refused == 0
    # The identity codec hands on views of the (read-only) records, not copies of them.
    assert all(payload.obj is record for (_, payload), record in zip(accepted, records,
                                                                     strict=True))

    target = torch.zeros(3, 2, 2, 8, 4, 16, dtype=dtype)
    blocks = BlockManager(num_blocks=8, block_size=4)
    assert install(blocks, target, layout, accepted) == 3
    for block_hash, source_id in zip(hashes, (4, 1, 5), strict=True):
        block_id = blocks.cached[block_hash]
        assert torch.equal(target[:, :, :, block_id], source[:, :, :, source_id])
    assert int((target != 0).any(dim=(0, 1, 2, 4, 5)).sum()) == 3  # no other block written
