"""The one thread that runs a process's torch work: engine steps, embedding batches, loads.

OpenMP keeps a team of worker threads for every thread that enters a parallel region. With
more team threads than cores (say an engine thread and a loader thread, each with a team of
two, on two cores), libgomp throttles its spin-waits, and every one of the ~150 parallel
regions of a decode step then pays a sleeping worker's wake-up: measured here, 17 ms steps
became 25 ms. So a node funnels all torch work through one thread. The price is that a cold
model load (a few seconds; a warm one is ~0.2 s) pauses the other models' steps meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Executor, Future
from typing import Protocol

log = logging.getLogger(__name__)


class SteppedWork(Protocol):
    """Something that advances in steps: the compute thread runs one step per round."""

    def has_work(self) -> bool: ...

    def run_once(self) -> None: ...

    def fail(self, exc: BaseException) -> None:
        """run_once raised: report it to whoever waits; the work is detached."""
        ...


class ComputeThread(Executor):
    """Runs submitted calls and attached stepped work on one thread, round by round."""

    def __init__(self, name: str = "edgefire-compute") -> None:
        self._jobs: deque[tuple[Future, object, tuple, dict]] = deque()
        self._work: list[SteppedWork] = []
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self._stopped:
            raise RuntimeError("the compute thread is stopped")
        future: Future = Future()
        self._jobs.append((future, fn, args, kwargs))
        self._wake.set()
        return future

    def attach(self, work: SteppedWork) -> None:
        self.submit(self._work.append, work)

    def detach(self, work: SteppedWork) -> None:
        self.submit(self._remove, work)

    def wake(self) -> None:
        self._wake.set()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stopped = True
        self._wake.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _remove(self, work: SteppedWork) -> None:
        if work in self._work:
            self._work.remove(work)

    def _run(self) -> None:
        while not self._stopped:
            busy = self._run_jobs()
            for work in list(self._work):
                if not work.has_work():
                    continue
                busy = True
                try:
                    work.run_once()
                except BaseException as exc:  # one model's failure must not stop the others
                    log.exception("stepped work failed; detaching it")
                    self._remove(work)
                    work.fail(exc)
            if not busy:
                self._wake.wait()
                self._wake.clear()
        for future, *_ in self._jobs:
            future.cancel()

    def _run_jobs(self) -> bool:
        ran = False
        while self._jobs:
            future, fn, args, kwargs = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            ran = True
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)
        return ran
