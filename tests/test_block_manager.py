"""The KV block pool: allocation, ref counts, hash-chain prefix caching and LRU eviction."""

from __future__ import annotations

import itertools

import pytest
import torch

from edgefire.runtime.engine.block_manager import BlockManager, hash_block
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.engine.sequence import Sequence

BS = 4
_ids = itertools.count()


def make_seq(tokens: list[int], salt: bytes = b"") -> Sequence:
    return Sequence(f"seq-{next(_ids)}", list(tokens), len(tokens), SamplingParams(),
                    torch.Generator(), salt)


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Admit seq as the scheduler does, compute its whole prompt and publish its full blocks."""
    cached = bm.find_cached_blocks(seq)
    hit = len(cached) * bm.block_size
    assert bm.allocate(seq, seq.num_tokens - hit, cached)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def snapshot(bm: BlockManager) -> tuple:
    return (list(bm.free_queue), dict(bm.cached),
            [(b.ref_count, b.block_hash) for b in bm.blocks])


def assert_drained(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks
    assert sorted(bm.free_queue) == list(range(bm.num_blocks))
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert bm.usage == 0.0


def test_allocate_and_free() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(10)))
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 == bm.num_blocks_for(10)
    assert len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 5
    assert all(bm.blocks[b].ref_count == 1 for b in seq.block_table)
    assert not set(seq.block_table) & set(bm.free_queue)
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(seq)
    assert seq.block_table == []
    assert_drained(bm)


def test_allocate_grows_only_at_block_boundaries() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(5)))
    assert bm.allocate(seq, 5)
    seq.num_computed_tokens = 5
    table = list(seq.block_table)
    for n in range(5, 8):  # decode tokens 6..8 fit in the second block
        seq.token_ids.append(n)
        assert bm.allocate(seq, 1)
        assert seq.block_table == table
        seq.num_computed_tokens += 1
    seq.token_ids.append(99)
    assert bm.allocate(seq, 1)  # token 9 opens a third block
    assert seq.block_table[:2] == table and len(seq.block_table) == 3
    bm.free(seq)
    assert_drained(bm)


def test_num_blocks_for() -> None:
    bm = BlockManager(4, BS)
    assert [bm.num_blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_hash_chain_depends_on_parent_salt_and_tokens() -> None:
    a = hash_block(b"", b"", [1, 2, 3, 4])
    assert a == hash_block(b"", b"", [1, 2, 3, 4])
    assert a != hash_block(b"", b"acct", [1, 2, 3, 4])
    assert a != hash_block(b"", b"", [1, 2, 3, 5])
    assert hash_block(a, b"", [5, 6, 7, 8]) != hash_block(b"", b"", [5, 6, 7, 8])
    seq = make_seq(list(range(11)))
    BlockManager(4, BS).update_hashes(seq)
    assert len(seq.block_hashes) == 2  # full blocks only
    assert seq.block_hashes[1] == hash_block(seq.block_hashes[0], b"", [4, 5, 6, 7])


def test_prefix_hit_shares_blocks_and_counts_refs() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(100, 110))  # two full blocks and two tokens
    first = make_seq(prompt)
    prefill(bm, first)
    assert len(bm.cached) == 2

    second = make_seq(prompt[:8] + [7, 7, 7])
    hits = bm.find_cached_blocks(second)
    assert hits == first.block_table[:2]
    assert bm.allocate(second, second.num_tokens - 2 * BS, hits)
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    # The table covers every known token once the hit blocks are counted.
    assert len(second.block_table) == bm.num_blocks_for(second.num_tokens)
    assert [bm.blocks[b].ref_count for b in first.block_table] == [2, 2, 1]
    assert bm.num_free_blocks == 16 - 4

    bm.free(first)
    assert [bm.blocks[b].ref_count for b in second.block_table] == [1, 1, 1]
    assert not set(second.block_table) & set(bm.free_queue)
    bm.free(second)
    assert_drained(bm)


def test_hit_revives_freed_cached_blocks() -> None:
    bm = BlockManager(8, BS)
    prompt = list(range(9))
    first = make_seq(prompt)
    prefill(bm, first)
    shared = first.block_table[:2]
    bm.free(first)
    assert_drained(bm)
    assert all(bm.blocks[b].block_hash is not None for b in shared)  # still cached when free

    second = make_seq(prompt)
    prefill(bm, second)
    assert second.block_table[:2] == shared
    assert all(b not in bm.free_queue for b in second.block_table)
    assert bm.num_free_blocks == 8 - 3
    bm.free(second)
    assert_drained(bm)


def test_different_salt_never_hits() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(13))
    prefill(bm, make_seq(prompt, salt=b"account-a"))
    assert bm.find_cached_blocks(make_seq(prompt, salt=b"account-b")) == []
    assert bm.find_cached_blocks(make_seq(prompt)) == []
    assert len(bm.find_cached_blocks(make_seq(prompt, salt=b"account-a"))) == 3


def test_hit_stops_at_first_miss() -> None:
    bm = BlockManager(16, BS)
    prefill(bm, make_seq(list(range(17))))
    changed = list(range(17))
    changed[5] = 999  # second block differs: later blocks hash differently too
    assert len(bm.find_cached_blocks(make_seq(changed))) == 1


def test_last_token_is_never_served_from_cache() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(2 * BS))  # exactly two full blocks
    first = make_seq(prompt)
    prefill(bm, first)
    assert len(bm.cached) == 2
    hits = bm.find_cached_blocks(make_seq(prompt))
    assert hits == first.block_table[:1]  # the block holding the last token is recomputed
    longer = make_seq(prompt + [0])
    assert bm.find_cached_blocks(longer) == first.block_table[:2]


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    prompt = list(range(9))
    prefill(bm, make_seq(prompt))
    assert bm.cached == {}
    assert bm.find_cached_blocks(make_seq(prompt)) == []


def test_only_computed_full_blocks_are_published() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq(list(range(11)))
    assert bm.allocate(seq, 6)  # a first chunk of 6 tokens
    seq.num_computed_tokens = 6
    bm.cache_full_blocks(seq)
    assert list(bm.cached.values()) == seq.block_table[:1]
    assert bm.allocate(seq, 5)
    seq.num_computed_tokens = 11
    bm.cache_full_blocks(seq)
    assert list(bm.cached.values()) == seq.block_table[:2]  # the partial third block is not


def test_duplicate_block_stays_private() -> None:
    bm = BlockManager(8, BS)
    prompt = list(range(5))
    a, b = make_seq(prompt), make_seq(prompt)
    for seq in (a, b):  # both admitted before either is computed: no hit for b
        assert bm.find_cached_blocks(seq) == []
        assert bm.allocate(seq, seq.num_tokens)
    for seq in (a, b):
        seq.num_computed_tokens = seq.num_tokens
        bm.cache_full_blocks(seq)
    assert bm.cached == {a.block_hashes[0]: a.block_table[0]}
    assert bm.blocks[b.block_table[0]].block_hash is None
    bm.free(a)
    bm.free(b)
    assert_drained(bm)


def test_lru_eviction_of_freed_cached_blocks() -> None:
    bm = BlockManager(4, BS)
    seqs = [make_seq([10 * i + j for j in range(BS + 1)]) for i in range(2)]
    for seq in seqs:  # two blocks each: the pool is full
        prefill(bm, seq)
    assert bm.num_free_blocks == 0
    assert len(bm.cached) == 2
    for seq in seqs:
        bm.free(seq)
    head0, head1 = (bm.cached[s.block_hashes[0]] for s in seqs)
    # Freed in order: seq 0's tail, seq 0's head, seq 1's tail, seq 1's head.

    fresh = make_seq([777] * (BS + 1))
    assert bm.allocate(fresh, 5)
    # The two oldest frees went first: seq 0's blocks; seq 0's cached head is evicted.
    assert head0 in fresh.block_table
    assert seqs[0].block_hashes[0] not in bm.cached
    assert bm.blocks[head0].block_hash is None
    assert bm.cached == {seqs[1].block_hashes[0]: head1}
    assert bm.find_cached_blocks(make_seq(seqs[0].token_ids)) == []
    assert bm.find_cached_blocks(make_seq(seqs[1].token_ids)) == [head1]

    more = make_seq([555] * 2)
    assert bm.allocate(more, 2)  # the next oldest is seq 1's uncached tail, not its head
    assert head1 not in more.block_table
    assert bm.cached == {seqs[1].block_hashes[0]: head1}
    assert bm.allocate(make_seq([1]), 1)  # only now is seq 1's head evicted
    assert bm.cached == {}


def test_tail_blocks_are_evicted_before_heads() -> None:
    bm = BlockManager(3, BS)
    seq = make_seq(list(range(3 * BS)))
    prefill(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    assert list(bm.free_queue) == table[::-1]


def test_allocate_failure_changes_nothing() -> None:
    bm = BlockManager(4, BS)
    cached_seq = make_seq(list(range(2 * BS + 1)))
    prefill(bm, cached_seq)  # three blocks, two of them cached
    bm.free(cached_seq)
    holder = make_seq([1, 2, 3])
    assert bm.allocate(holder, 3)  # takes the one never-used block
    before = snapshot(bm)

    big = make_seq(list(range(20)))
    assert not bm.allocate(big, 20)
    assert big.block_table == []
    assert snapshot(bm) == before

    # Reusing the two cached free blocks plus five new ones needs seven free blocks; three exist.
    hit = make_seq(cached_seq.token_ids[:2 * BS] + list(range(50, 70)))
    cached = bm.find_cached_blocks(hit)
    assert len(cached) == 2
    assert not bm.allocate(hit, hit.num_tokens - 2 * BS, cached)
    assert hit.block_table == []
    assert snapshot(bm) == before

    holder.num_computed_tokens = 3
    holder.token_ids += list(range(30))
    assert not bm.allocate(holder, 30)
    assert len(holder.block_table) == 1
    assert snapshot(bm) == before


def test_no_leak_after_drain() -> None:
    bm = BlockManager(64, BS)
    system = list(range(200, 200 + 3 * BS))
    live = []
    for i in range(12):
        seq = make_seq(system + [i] * (i + 1), salt=b"a" if i % 3 else b"b")
        prefill(bm, seq)
        for _ in range(i % 5):  # a few decode steps
            seq.token_ids.append(i)
            assert bm.allocate(seq, 1)
            seq.num_computed_tokens += 1
            bm.cache_full_blocks(seq)
        live.append(seq)
        if i % 2:
            bm.free(live.pop(0))
    for seq in live:
        bm.free(seq)
    assert_drained(bm)
    # Every cached entry points at a block that carries that hash.
    assert all(bm.blocks[b].block_hash == h for h, b in bm.cached.items())


def test_double_free_is_caught() -> None:
    bm = BlockManager(4, BS)
    seq = make_seq([1, 2, 3])
    assert bm.allocate(seq, 3)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(AssertionError):
        bm.free(seq)
