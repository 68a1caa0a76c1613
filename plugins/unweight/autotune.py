"""Per weight shape, up to how many token rows the fused decode-in-matvec kernel beats
decoding the weight and calling torch's matmul (Unweight tunes its kernel choice per
projection the same way: by measuring, because the crossover depends on shape and machine).

Results are kept per machine, thread count and shape in the warm cache folder, so a node
measures each shape once; tuning a shape takes well under a second.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable

import torch

from edgefire.runtime.weights.warm_cache import cache_root, dtype_name

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FILE = "unweight-autotune.json"
_lock = threading.Lock()
log = logging.getLogger(__name__)


def _seconds(fn: Callable[[], object], budget: float = 0.02) -> float:
    """Best time of a few calls, after one warm-up."""
    fn()
    best = float("inf")
    spent, calls = 0.0, 0
    while calls < 3 or (spent < budget and calls < 20):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
    return best


def measure_crossover(fused: Callable[[torch.Tensor], object],
                      unfused: Callable[[torch.Tensor], object], k: int,
                      dtype: torch.dtype) -> int:
    """The largest row count (of ROWS) up to which `fused` is at least as fast (0: never)."""
    best = 0
    generator = torch.Generator().manual_seed(0)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator).to(dtype)
        if _seconds(lambda x=x: fused(x)) > _seconds(lambda x=x: unfused(x)):
            break
        best = rows
    return best


def _key(shape: tuple[int, int], dtype: torch.dtype) -> str:
    return (f"{platform.processor() or platform.machine()}/{os.cpu_count()}cpu/"
            f"{torch.get_num_threads()}threads/{dtype_name(dtype)}/"
            f"{shape[0]}x{shape[1]}")


def crossover(shape: tuple[int, int], dtype: torch.dtype,
              measure: Callable[[], int]) -> int:
    """The stored crossover for this shape, or `measure()`'s, stored for next time."""
    path = cache_root() / _FILE
    key = _key(shape, dtype)
    with _lock:
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            return int(known[key])
        value = measure()
        known[key] = value
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError as exc:  # a read-only cache only costs a re-measure next start
            log.warning("could not store autotune results in %s: %s", path, exc)
        log.info("unweight autotune %s: fused kernel up to %d rows", key, value)
        return value
