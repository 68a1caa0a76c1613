"""Models a node holds: loaded on first request (single flight), evicted LRU to fit a budget.

A model is never evicted while a request is using it: requests hold it through `use()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from runtime.catalog import Catalog, ModelSpec
from runtime.errors import EdgefireError

log = logging.getLogger(__name__)


class CapacityError(EdgefireError):
    """The node cannot take this request now (busy, or no room to load the model)."""

    code = 3040
    status = 429


class ServedModel(Protocol):
    spec: ModelSpec

    @property
    def memory_bytes(self) -> int: ...

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
        self._loading: dict[str, asyncio.Future[_Entry]] = {}
        self.num_loads = 0
        self.num_evictions = 0

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[ServedModel]:
        """The model for an id or alias, loaded if needed, held for the duration."""
        spec = self.catalog.get_runnable(name)
        entry = self._entries.get(spec.id) or await self._load_once(spec)
        entry.active += 1
        try:
            yield entry.model
        finally:
            entry.active -= 1
            entry.last_used = time.monotonic()

    def models(self) -> dict[str, ServedModel]:
        """The loaded models by id (a snapshot: it does not keep an evicted model alive)."""
        return {model_id: e.model for model_id, e in self._entries.items()}

    def loaded(self) -> dict[str, dict]:
        return {model_id: {"active_requests": e.active, "memory_bytes": e.model.memory_bytes}
                for model_id, e in self._entries.items()}

    @property
    def used_bytes(self) -> int:
        return sum(e.model.memory_bytes for e in self._entries.values())

    def close(self) -> None:
        for entry in self._entries.values():
            entry.model.close()
        self._entries.clear()

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
        self._make_room(_declared_bytes(spec))
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(self._executor, self._build, spec)
        entry = _Entry(model, last_used=time.monotonic())
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
            self._entries.pop(victim).model.close()
            self.num_evictions += 1
            log.info("evicted %s to make room", victim)
        if need > self.budget_bytes:
            raise CapacityError(f"the model needs {need >> 20} MiB; this node's budget is "
                                f"{self.budget_bytes >> 20} MiB")


def _declared_bytes(spec: ModelSpec) -> int:
    return int(spec.extra.get("memory_mib", 0)) << 20
