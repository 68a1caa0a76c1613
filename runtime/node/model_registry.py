"""Models a node holds: loaded on first request (single flight), evicted LRU to fit a budget.

A model is never evicted while a request is using it: requests hold it through `use()`.
A model whose engine died is dropped by the next request for it and loaded again (from the
warm-start cache, so in well under a second); until the new one has run a step the node
counts it as degraded.

The event loop changes the registry; the heartbeat thread reads it: changes and reads of the
table of entries take a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from edgefire.contract.catalog import Catalog, ModelSpec
from edgefire.contract.errors import CapacityError

log = logging.getLogger(__name__)


class ServedModel(Protocol):
    spec: ModelSpec

    @property
    def memory_bytes(self) -> int: ...

    @property
    def dead(self) -> bool:
        """It serves no more: drop it and load it again."""
        ...

    @property
    def degraded(self) -> bool:
        """Dead, or failed lately and not working again yet."""
        ...

    def mark_degraded(self) -> None:
        """It replaces a model that died: degraded until it has worked."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Entry:
    model: ServedModel
    active: int = 0
    last_used: float = 0.0


class ModelRegistry:
    def __init__(self, catalog: Catalog, budget_bytes: int,
                 build: Callable[[ModelSpec], ServedModel],
                 executor: Executor | None = None) -> None:
        self.catalog = catalog
        self.budget_bytes = budget_bytes
        self._build = build
        self._executor = executor  # where loads run (None: asyncio's default thread pool)
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()  # guards _entries and _died against the heartbeat thread
        self._died: set[str] = set()  # ids dropped dead and not loaded again successfully
        self._loading: dict[str, asyncio.Future[_Entry]] = {}
        self.num_loads = 0
        self.num_evictions = 0

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[ServedModel]:
        """The model for an id or alias, loaded if needed, held for the duration."""
        spec = self.catalog.get_runnable(name)
        entry = self._entries.get(spec.id)
        if entry is not None and entry.model.dead:
            log.warning("the engine of %s died; loading it again", spec.id)
            self._remove(spec.id, died=True)
            entry = None
        entry = entry or await self._load_once(spec)
        entry.active += 1
        try:
            yield entry.model
        finally:
            entry.active -= 1
            entry.last_used = time.monotonic()

    def models(self) -> dict[str, ServedModel]:
        """The loaded models by id (a snapshot: it does not keep an evicted model alive)."""
        return {model_id: e.model for model_id, e in self._snapshot()}

    def loaded(self) -> dict[str, dict]:
        return {model_id: {"active_requests": e.active, "memory_bytes": e.model.memory_bytes}
                for model_id, e in self._snapshot()}

    def degraded(self) -> list[str]:
        """Ids of models that failed lately: dead, not working again yet since a failure, or
        dropped dead and not loaded again successfully."""
        with self._lock:
            failed = set(self._died)
        failed.update(model_id for model_id, e in self._snapshot() if e.model.degraded)
        return sorted(failed)

    @property
    def used_bytes(self) -> int:
        return sum(e.model.memory_bytes for _, e in self._snapshot())

    def close(self) -> None:
        with self._lock:
            entries, self._entries = self._entries, {}
        for entry in entries.values():
            entry.model.close()

    def _snapshot(self) -> list[tuple[str, _Entry]]:
        with self._lock:
            return list(self._entries.items())

    def _remove(self, model_id: str, *, died: bool = False) -> None:
        with self._lock:
            entry = self._entries.pop(model_id)
            if died:  # degraded until it is loaded again (an evicted dead model is just gone)
                self._died.add(model_id)
        entry.model.close()

    async def _load_once(self, spec: ModelSpec) -> _Entry:
        # Concurrent first requests share one load; shield() keeps a cancelled waiter (a
        # client that went away) from cancelling the load the others wait on.
        future = self._loading.get(spec.id)
        if future is None:
            future = asyncio.ensure_future(self._load(spec))
            self._loading[spec.id] = future
            future.add_done_callback(lambda _: self._loading.pop(spec.id, None))
        return await asyncio.shield(future)

    async def _load(self, spec: ModelSpec) -> _Entry:
        self._make_room(spec.need_bytes)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(self._executor, self._build, spec)
        entry = _Entry(model, last_used=time.monotonic())
        with self._lock:
            if spec.id in self._died:
                model.mark_degraded()
                self._died.discard(spec.id)
            self._entries[spec.id] = entry
        self.num_loads += 1
        log.info("loaded %s in %.2fs (%.0f MiB)", spec.id, time.perf_counter() - started,
                 model.memory_bytes / (1 << 20))
        return entry

    def _make_room(self, need: int) -> None:
        while self._entries and self.used_bytes + need > self.budget_bytes:
            idle = [(e.last_used, model_id) for model_id, e in self._entries.items()
                    if e.active == 0]
            if not idle:
                raise CapacityError("every loaded model is busy and the node has no room "
                                    "to load another; retry later")
            _, victim = min(idle)
            self._remove(victim)
            self.num_evictions += 1
            log.info("evicted %s to make room", victim)
        if need > self.budget_bytes:
            raise CapacityError(f"the model needs {need >> 20} MiB; this node's budget is "
                                f"{self.budget_bytes >> 20} MiB")
