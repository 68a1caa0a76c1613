"""bench/decode_attention.py's block orders: each a valid table, the engine's as it allocates."""

from __future__ import annotations

import pytest
import torch

from bench.decode_attention import BLOCK, CONTEXT, PROMPT, block_tables


@pytest.mark.parametrize("order", ["in order", "engine", "random"])
def test_every_order_gives_each_sequence_its_own_blocks(order):
    tables = block_tables(order, 8, 1000, torch.Generator().manual_seed(0))
    assert tables.shape == (8, -(-CONTEXT // BLOCK))
    assert tables.unique().numel() == tables.numel()
    assert int(tables.min()) >= 0 and int(tables.max()) < 1000


def test_the_engine_order_keeps_prompts_together_and_interleaves_decode_blocks():
    seqs, prompt = 4, -(-PROMPT // BLOCK)
    tables = block_tables("engine", seqs, 1000, torch.Generator())
    assert tables[1, :prompt].tolist() == list(range(prompt, 2 * prompt))
    # each later block is taken by every sequence in one step, in sequence order
    assert tables[:, prompt].tolist() == [seqs * prompt + s for s in range(seqs)]
    assert tables[2, prompt + 1] == seqs * prompt + seqs + 2
