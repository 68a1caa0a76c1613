"""The machine's roofline as the benches see it: read bandwidth and GEMM throughput.

Decode speed is bounded by how fast weights are read, prefill by matmul throughput, so every
result file records both, measured the same way, to tell a slower machine from a slower engine.
The GEMM is measured in the dtype the engine's batched steps compute in on this CPU
(EngineConfig(dtype="auto"): bfloat16, or float32 on AVX2-only CPUs, where torch's bfloat16
GEMM is a slow fallback), so "fraction of the GEMM roofline" compares like with like.
`measure_roofline()` measures in a child process: the 512 MiB buffer would otherwise raise the
calling bench's peak RSS (ru_maxrss), which the benches report.

Run alone: .venv/bin/python -m bench.roofline (prints the JSON).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from bench._common import best_seconds

THREADS = 2  # the benches' default thread count, so the numbers bound what they can reach
READ_BYTES = 512 << 20
GEMM_N = 2048
REPEATS = 5


def _best_seconds(fn: Callable[[], object]) -> float:
    return best_seconds(fn, REPEATS, warmup=True)  # warm-up: page faults, kernel selection


def _read_seconds(torch: ModuleType) -> float:
    # The faster of a reduction and a float32 matrix-vector product (a decode step's access
    # pattern, and here the faster reader: 31 vs 24 GB/s measured): the higher the bound, the
    # more honest "fraction of read bandwidth" is.
    x = torch.ones(READ_BYTES // 4, dtype=torch.float32)  # freed on return
    rows = x.view(8192, -1)
    v = torch.ones(rows.shape[1])
    return min(_best_seconds(lambda: x.sum()), _best_seconds(lambda: torch.mv(rows, v)))


def _gemm_seconds(torch: ModuleType, dtype: object) -> float:
    a, b = (torch.randn(GEMM_N, GEMM_N).to(dtype) for _ in range(2))
    return _best_seconds(lambda: torch.mm(a, b))


def _measure() -> dict:
    import torch

    from edgefire.runtime.engine.precision import Precision

    torch.set_num_threads(THREADS)
    dtype = Precision.parse("auto").large
    name = str(dtype).removeprefix("torch.")
    read_s, gemm_s = _read_seconds(torch), _gemm_seconds(torch, dtype)
    return {"threads": THREADS,
            "read_gb_s": round(READ_BYTES / read_s / 1e9, 2),
            "read_method": f"faster of torch.sum and torch.mv over {READ_BYTES >> 20} MiB "
                           f"float32, best of {REPEATS}",
            "gemm_dtype": name,
            "gemm_tflop_s": round(2 * GEMM_N**3 / gemm_s / 1e12, 3),
            "gemm_method": f"torch.mm {name} [{GEMM_N},{GEMM_N}]x[{GEMM_N},{GEMM_N}], "
                           f"best of {REPEATS}",
            "torch": torch.__version__}


def measure_roofline() -> dict:
    """Read GB/s and GEMM TFLOP/s on THREADS threads, measured in a child process."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run([sys.executable, "-m", "bench.roofline"], cwd=root, check=True,
                             capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"available": False, "note": f"roofline measurement failed: {exc!r}"}


if __name__ == "__main__":
    print(json.dumps(_measure()))
