"""KV block manager: a preallocated pool of fixed-size pages with hash-chain prefix caching.

Free blocks sit in an LRU queue. A freed block keeps its prefix hash until it is handed out
again, so a later request with the same prefix (and the same salt) can take it back: eviction
is simply reuse of the least recently freed block. A remote KV tier
(runtime/engine/remote_kv/tier.py) adds blocks to the cache from outside (`adopt`) and reads
the blocks the cache publishes (`published`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from edgefire.runtime.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    remote: bool = False  # adopted from the remote tier and not hit since


def hash_block(parent: bytes, salt: bytes, token_ids: list[int]) -> bytes:
    """Chain hash of one full block; the salt enters every link, so accounts never collide."""
    h = hashlib.sha256(parent)
    h.update(salt)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def prefix_hashes(token_ids: list[int], salt: bytes, block_size: int) -> list[bytes]:
    """Chain hashes of the blocks of a prompt a prefix hit may cover: its full blocks, but one
    token short (find_cached_blocks says why)."""
    hashes: list[bytes] = []
    for i in range((len(token_ids) - 1) // block_size):
        tokens = token_ids[i * block_size:(i + 1) * block_size]
        hashes.append(hash_block(hashes[-1] if hashes else b"", salt, tokens))
    return hashes


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_prefix_remote_hit_tokens = 0  # of the hits, tokens of adopted blocks
        # With a remote tier: (block id, hash) of each block published since the engine last
        # took the list; None when nobody reads it.
        self.published: list[tuple[int, bytes]] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def update_hashes(self, seq: Sequence) -> None:
        """Extend seq.block_hashes over every full block of its known tokens."""
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_tokens // bs):
            parent = seq.block_hashes[i - 1] if i else b""
            tokens = seq.token_ids[i * bs:(i + 1) * bs]
            seq.block_hashes.append(hash_block(parent, seq.salt, tokens))

    def find_cached_blocks(self, seq: Sequence) -> list[int]:
        """Longest run of cached blocks for seq's prefix; no side effects on the pool.

        Capped one token short of the sequence so the last token is always computed: its
        logits are needed to sample.
        """
        if not self.enable_prefix_caching:
            return []
        self.update_hashes(seq)
        limit = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in seq.block_hashes[:limit]:
            block_id = self.cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Give seq blocks for num_new_tokens beyond its computed tokens and the `cached` prefix.

        `cached` (from find_cached_blocks) is taken first. Returns False, changing nothing, if
        the pool cannot supply the blocks.
        """
        num_cached_free = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        have = len(seq.block_table) + len(cached)
        num_tokens = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        num_needed = self.num_blocks_for(num_tokens) - have
        if max(num_needed, 0) + num_cached_free > self.num_free_blocks:
            return False
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
        seq.block_table.extend(cached)
        for _ in range(num_needed):
            seq.block_table.append(self._pop_free())
        return True

    def record_prefix_query(self, num_query_tokens: int, hits: list[int]) -> None:
        """Count a lookup whose hit blocks (as allocated) are `hits`; a block adopted from the
        remote tier counts as a remote hit the first time, a local one after that."""
        self.num_prefix_queried_tokens += num_query_tokens
        self.num_prefix_hit_tokens += len(hits) * self.block_size
        for block_id in hits:
            block = self.blocks[block_id]
            if block.remote:
                self.num_prefix_remote_hit_tokens += self.block_size
                block.remote = False

    def adopt(self, block_hash: bytes) -> int | None:
        """A free block, now cached under block_hash, for the caller to fill with that block's
        KV; None when the hash is cached already or no block is free. It stays free (the most
        recently freed), so it is evicted like any cached block no one holds."""
        if block_hash in self.cached or not self.free_queue:
            return None
        block_id = self._pop_free()
        block = self.blocks[block_id]
        block.ref_count = 0
        block.block_hash = block_hash
        block.remote = True
        self.cached[block_hash] = block_id
        self.free_queue[block_id] = None
        return block_id

    def cache_full_blocks(self, seq: Sequence, limit: int | None = None) -> None:
        """Publish seq's fully computed blocks (at most its first `limit`) in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        self.update_hashes(seq)
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_hashes))
        if limit is not None:
            num_full = min(num_full, limit)
        for i in range(num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is not None:
                continue
            block_hash = seq.block_hashes[i]
            # An identical block computed by another sequence may already be published; block
            # tables are append-only, so the duplicate simply stays private.
            if block_hash not in self.cached:
                self.cached[block_hash] = block.block_id
                block.block_hash = block_hash
                if self.published is not None:
                    self.published.append((block.block_id, block_hash))

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks; tail blocks are queued first so they are evicted first."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        seq.block_table = []

    def _pop_free(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.remote = False
        block.ref_count = 1
        return block_id
