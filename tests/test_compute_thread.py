"""The compute thread: one thread for jobs and stepped work, round-robin, failures contained."""

from __future__ import annotations

import threading
import time

import pytest

from edgefire.runtime.engine.compute_thread import ComputeThread


class Counter:
    def __init__(self, steps: int, fail_at: int | None = None) -> None:
        self.left = steps
        self.fail_at = fail_at
        self.threads: set[str] = set()
        self.failed: BaseException | None = None
        self.done = threading.Event()

    def has_work(self) -> bool:
        return self.left > 0

    def run_once(self) -> None:
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and self.left == self.fail_at:
            raise RuntimeError("boom")
        self.left -= 1
        if not self.left:
            self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.failed = exc
        self.done.set()


@pytest.fixture
def compute():
    thread = ComputeThread("test-compute")
    yield thread
    thread.shutdown()


def test_jobs_and_stepped_work_share_one_thread(compute):
    a, b = Counter(5), Counter(3)
    compute.attach(a)
    compute.attach(b)
    job_thread = compute.submit(lambda: threading.current_thread().name).result(timeout=5)
    assert a.done.wait(5) and b.done.wait(5)
    assert a.threads == b.threads == {job_thread} == {"test-compute"}


def test_a_failing_work_is_detached_and_told_while_others_go_on(compute):
    bad, good = Counter(5, fail_at=3), Counter(4)
    compute.attach(bad)
    compute.attach(good)
    assert bad.done.wait(5) and good.done.wait(5)
    assert isinstance(bad.failed, RuntimeError) and good.failed is None and good.left == 0
    assert bad.left == 3  # stopped at the failing step, never stepped again


def test_job_exceptions_reach_the_future(compute):
    future = compute.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        future.result(timeout=5)


def test_work_attached_later_wakes_an_idle_thread(compute):
    time.sleep(0.05)  # idle, waiting
    late = Counter(2)
    compute.attach(late)
    assert late.done.wait(5)
