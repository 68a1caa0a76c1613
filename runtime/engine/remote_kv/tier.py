"""The remote tier behind a node's page pool (Mooncake Store / LMCache in spirit).

Full blocks the prefix cache publishes are copied out of the pool on the compute thread (one
gather) and written to the store by a writer thread of the tier's own, pipelined, so a step
never waits on the network. A request whose prefix the local pool misses is looked up in the
store before it is queued (off the compute thread); the longest run of pages found whole is
installed into free blocks of the pool as cached blocks, and the scheduler then admits the
request with those blocks as ordinary prefix hits. A page that is missing, truncated, of
another layout or fails its checksum ends the run: the rest is recomputed, never guessed.

Keys are `<namespace>:<chain hash>`. The chain hash carries the account's keyed salt
(runtime/engine/block_manager.py) and the namespace digests the model, its weights and the
page layout, so a page of another account or model can never be read.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from edgefire.runtime.engine.remote_kv.codec import IDENTITY, KVCodec
from edgefire.runtime.engine.remote_kv.latency import LatencyHistogram
from edgefire.runtime.engine.remote_kv.page_format import PageLayout, pack
from edgefire.runtime.engine.remote_kv.pages import Page, accept, gather, page_bytes
from edgefire.runtime.engine.remote_kv.store import PageStore, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bytes of pages waiting for the writer at most; past this (a store slower than the engine)
# new pages are not written rather than held in memory without bound.
MAX_QUEUED_BYTES = 128 << 20
MAX_LOOKUP_PAGES = 1024  # one lookup fetches at most this many pages (16k tokens at 16)
PROBE_INTERVAL_S = 2.0  # the writer pings an idle store this often, for /health


@dataclass(slots=True)
class TierStats:
    """Counters since the tier started; changed under the tier's lock, read whole from any
    thread."""

    num_pages_written: int = 0
    num_bytes_written: int = 0
    num_pages_read: int = 0
    num_bytes_read: int = 0
    num_pages_rejected: int = 0  # found but refused: damaged or of another layout
    num_pages_dropped: int = 0  # not written: the store was unavailable or the queue full
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass(slots=True)
class _Batch:
    hashes: list[bytes]
    pages: np.ndarray  # [n, *layout.shape], a plain copy the compute thread made


class RemoteTier:
    def __init__(self, store: PageStore, layout: PageLayout, namespace: str,
                 codec: KVCodec = IDENTITY) -> None:
        if not namespace:
            raise ValueError("a remote KV tier needs a namespace (model and weights digest)")
        self.store = store
        self.codec = codec
        self.layout = layout
        self.namespace = namespace
        self.stats = TierStats()
        self.available = True  # the store's state as the last call or probe found it
        self._stats_lock = threading.Lock()  # the writer and lookup threads both count
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._max_queued_pages = max(1, MAX_QUEUED_BYTES // layout.num_bytes)
        self._num_queued_pages = 0
        self._drained = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="edgefire-kv-writer",
                                        daemon=True)
        self._writer.start()

    def key(self, block_hash: bytes) -> str:
        return f"{self.namespace}:{block_hash.hex()}"

    # The compute thread's side.
    def publish(self, cache: torch.Tensor, published: list[tuple[int, bytes]]) -> None:
        """Queue the pages of newly published blocks [(block id, chain hash)] for the store."""
        if not published:
            return
        with self._drained:
            full = self._num_queued_pages + len(published) > self._max_queued_pages
            if not full:
                self._num_queued_pages += len(published)
        if full:
            self._count_dropped(len(published))
            return
        ids = torch.tensor([block_id for block_id, _ in published])
        self._queue.put(_Batch([h for _, h in published], gather(cache, ids)))

    # Any thread but the compute thread.
    def lookup(self, cached: Mapping[bytes, int], hashes: list[bytes]) -> list[Page]:
        """Pages for the blocks after the local pool's run of `hashes`, as far as the store
        has them whole. Never raises for the store: unavailable reads as no pages."""
        start = 0
        while start < len(hashes) and hashes[start] in cached:
            start += 1
        wanted = hashes[start:start + MAX_LOOKUP_PAGES]
        if not wanted:
            return []
        ok, records = self._call(self.store.get_many, [self.key(h) for h in wanted])
        return self._accept(wanted, records) if ok else []

    def _accept(self, hashes: list[bytes], records: list[bytes | None]) -> list[Page]:
        pages, num_rejected = accept(self.layout, hashes, records, self.codec)
        with self._stats_lock:
            self.stats.num_pages_read += len(pages)
            self.stats.num_bytes_read += sum(len(r) for r in records[:len(pages)] if r)
            self.stats.num_pages_rejected += num_rejected
        return pages

    def _count_dropped(self, num_pages: int) -> None:
        with self._stats_lock:
            self.stats.num_pages_dropped += num_pages

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued page has been written (or dropped); False on timeout."""
        with self._drained:
            return self._drained.wait_for(lambda: self._num_queued_pages == 0, timeout_s)

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=5)
        self.store.close()

    # The writer thread.
    def _write_loop(self) -> None:
        while True:
            try:
                batch = self._queue.get(timeout=PROBE_INTERVAL_S)
            except queue.Empty:
                self.available = self.store.ping()
                continue
            if batch is None:
                return
            try:
                self._write(batch)
            except Exception:  # a bug here must not stop later writes or hang flush()
                log.exception("writing KV pages failed")
                self._count_dropped(len(batch.hashes))
            finally:
                with self._drained:
                    self._num_queued_pages -= len(batch.hashes)
                    self._drained.notify_all()

    def _write(self, batch: _Batch) -> None:
        codec, layout = self.codec, self.layout
        items = [(self.key(h), pack(layout, h, codec.encode(page_bytes(batch.pages[i]), layout),
                                    codec.name))
                 for i, h in enumerate(batch.hashes)]
        ok, _ = self._call(self.store.put_many, items)
        if not ok:
            self._count_dropped(len(items))
            return
        with self._stats_lock:
            self.stats.num_pages_written += len(items)
            self.stats.num_bytes_written += sum(len(record) for _, record in items)

    def _call(self, fn: Callable[[list], T], arg: list) -> tuple[bool, T | None]:
        """(True, fn(arg)) timed into the latency histogram, or (False, None) if the store is
        unavailable."""
        started = time.perf_counter()
        try:
            result = fn(arg)
        except StoreUnavailable:
            self.available = False
            return False, None
        with self._stats_lock:
            self.stats.latency.observe(time.perf_counter() - started)
        self.available = True
        return True, result
