"""Ranks of a parallel layout as threads of the test process, each its own Gloo rank."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from edgefire.runtime.parallel.collectives import Collectives, free_port


def run_ranks(world_size: int, fn: Callable[[int, Collectives], Any]) -> dict[int, Any]:
    """fn(rank, its collectives) on each rank's thread; what each returned, by rank. A rank
    that raised fails the test with its exception."""
    port = free_port()
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, Collectives.connect(port, rank, world_size, timeout_s=30))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results
