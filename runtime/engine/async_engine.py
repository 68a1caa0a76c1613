"""Asyncio front of the engine: its steps run on a compute thread, off the event loop.

Torch releases the GIL inside its kernels, so an HTTP server's event loop keeps serving while a
step runs. Requests and aborts reach the compute thread through a command queue drained before
each step; outputs come back through each request's asyncio queue. A node shares one compute
thread between its models (edgefire.runtime.engine.compute_thread says why); alone, an AsyncEngine
starts its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from edgefire.contract.errors import EngineFailedError, InvalidInputError
from edgefire.runtime.engine.compute_thread import ComputeThread
from edgefire.runtime.engine.llm_engine import LLMEngine, StepFailedError
from edgefire.runtime.engine.outputs import RequestOutput
from edgefire.runtime.engine.remote_kv.pages import Page
from edgefire.runtime.engine.remote_kv.tier import RemoteTier
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.engine.sequence import Sequence
from edgefire.runtime.engine.stats import EngineStats

log = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, compute: ComputeThread | None = None) -> None:
        self.engine = engine
        self._commands: deque[tuple[str, object]] = deque()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopped = False
        self._error: BaseException | None = None
        # Set by the compute thread when a step fails, cleared by its next successful step;
        # read from any thread (a bool is written and read whole).
        self._step_failed = False
        self._owns_compute = compute is None
        self._compute = compute or ComputeThread("edgefire-engine")
        self._compute.attach(self)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    salt: bytes = b"", pages: list[Page] | None = None
                    ) -> RequestStream:
        """Validate now (raising InvalidInputError) and return the request's output stream.

        Closing the stream before it finishes (a client disconnect) aborts the request. With
        a KV store, the prompt's prefix is first looked up there, on a worker thread; `pages`
        handed over by a prefill node (LLMEngine.install_pages) replace that lookup.
        """
        if self.dead or self._stopped:
            raise EngineFailedError()
        if request_id in self._streams:
            raise InvalidInputError(f"request id {request_id!r} is already running",
                                    field="request_id")
        seq = self.engine.prepare(request_id, prompt_token_ids, params, salt)
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._streams[request_id] = (loop, queue)
        if pages is not None or self.engine.remote is None:
            self._send("add", (seq, pages or []))
        else:
            loop.run_in_executor(None, self._look_up, seq)
        return RequestStream(self, request_id, queue)

    def _look_up(self, seq: Sequence) -> None:
        try:
            pages = self.engine.lookup_remote(seq)
        except Exception:  # a fault of ours, not the store's: serve the request all the same
            log.exception("remote KV lookup failed; computing the prompt")
            pages = []
        self._send("add", (seq, pages))

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._send("abort", request_id)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's stream; the engine has already let it go."""
        self._streams.pop(request_id, None)

    def shutdown(self) -> None:
        self._stopped = True
        self._compute.detach(self)
        if self._owns_compute:
            self._compute.shutdown()
        self.engine.close()

    @property
    def dead(self) -> bool:
        """The engine stopped on a failure it could not contain, or its model is lost (a
        parallel layout's worker died, maybe while idle): it serves no more."""
        return self._error is not None or self.engine.model_lost

    @property
    def degraded(self) -> bool:
        """Dead, or a step failed and none has succeeded since."""
        return self.dead or self._step_failed

    def mark_degraded(self) -> None:
        """This engine replaces one that died: degraded until a step of its own succeeds."""
        self._step_failed = True

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: queued in the scheduler or still in the command queue."""
        return max(0, len(self._streams) - len(self.engine.scheduler.running))

    @property
    def block_size(self) -> int:
        return self.engine.blocks.block_size

    def num_cached_leading(self, hashes: list[bytes]) -> int:
        """How many of hashes, from the first, the local pool caches now (it may evict them
        later)."""
        cached = self.engine.blocks.cached  # a dict read whole under the GIL
        return next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))

    def accept_records(self, hashes: list[bytes], records: list[bytes | None]) -> list[Page]:
        return self.engine.accept_records(hashes, records)

    async def export_pages(self, hashes: list[bytes]) -> list[bytes]:
        """Records of the cached run of hashes, gathered on the compute thread."""
        return await asyncio.wrap_future(self._compute.submit(self.engine.export_pages, hashes))

    async def flush_remote(self, timeout_s: float) -> bool:
        """Wait (off the loop) until the pages queued for the KV store are written."""
        tier = self.engine.remote
        return tier is None or await asyncio.to_thread(tier.flush, timeout_s)

    @property
    def remote_tier(self) -> RemoteTier | None:
        """The KV store tier behind the pool (its stats and state are read whole), if any."""
        return self.engine.remote

    def stats(self) -> EngineStats:
        """The engine's load as its scheduler sees it (LLMEngine.stats); any thread may call it."""
        return self.engine.stats()

    def _send(self, kind: str, payload: object) -> None:
        self._commands.append((kind, payload))
        self._compute.wake()

    # The compute thread's side (SteppedWork).
    def has_work(self) -> bool:
        return not self._stopped and (bool(self._commands) or self.engine.has_unfinished())

    def run_once(self) -> None:
        self._drain_commands()
        if not self.engine.has_unfinished():
            return
        try:
            outputs = self.engine.step()
        except StepFailedError as exc:  # only that step's requests are lost
            log.exception("a step failed; failing its %d request(s), the others go on",
                          len(exc.request_ids))
            self._step_failed = True
            self._deliver([(request_id, EngineFailedError()) for request_id in exc.request_ids])
            return
        self._step_failed = False
        self._deliver([(output.request_id, output) for output in outputs])

    def fail(self, exc: BaseException) -> None:
        """The engine could not go on (the compute thread logged why and detached it): fail
        every request in flight rather than hang its client. The node builds a new one."""
        self._error = exc
        self._deliver([(request_id, EngineFailedError()) for request_id in list(self._streams)])

    def _drain_commands(self) -> None:
        while self._commands:
            kind, payload = self._commands.popleft()
            if kind == "add":
                seq, pages = payload
                assert isinstance(seq, Sequence)
                if seq.request_id in self._streams:  # not aborted while queued
                    self.engine.install_pages(pages)
                    self.engine.enqueue(seq)
            else:
                self.engine.abort(payload)

    def _deliver(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """Hand a step's outputs to their requests' queues: one call into each event loop
        per step, not one per request, since each call wakes its loop with a write to a
        pipe (with 16 streams in flight, those writes were ~5% of the compute thread's time)."""
        per_loop: dict[asyncio.AbstractEventLoop, list[tuple[str, asyncio.Queue, object]]] = {}
        for request_id, item in items:
            target = self._streams.get(request_id)
            if target is not None:
                loop, queue = target
                per_loop.setdefault(loop, []).append((request_id, queue, item))
        for loop, batch in per_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the caller's loop is closed; nobody is listening any more
                for request_id, _, _ in batch:
                    self._send("abort", request_id)


def _put_all(batch: list[tuple[str, asyncio.Queue, object]]) -> None:
    for _, queue, item in batch:
        queue.put_nowait(item)


class RequestStream:
    """One request's outputs. Closing it before the last output aborts the request, whether
    or not it was ever read (an async generator's cleanup would only run once started)."""

    def __init__(self, engine: AsyncEngine, request_id: str, queue: asyncio.Queue) -> None:
        self._engine = engine
        self.request_id = request_id
        self._queue = queue
        self._finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if item.finished:
            self._finish()
        return item

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._engine.abort(self.request_id)

    def _finish(self) -> None:
        self._finished = True
        self._engine.forget(self.request_id)
