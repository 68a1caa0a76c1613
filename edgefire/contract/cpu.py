"""Which class of CPU this is, for the choices that depend on it (the engine's compute dtypes,
and the planner's bytes for the weights a node holds in them)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def _flags() -> frozenset[str]:
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


def cpu_class() -> str:
    """native_bfloat16, avx512, avx2 or other, from the CPU's flags."""
    flags = _flags()
    if flags & {"avx512_bf16", "amx_bf16"}:
        return "native_bfloat16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else "other"


def has_amx() -> bool:
    """Whether the CPU has AMX BF16 tiles, which torch's BF16 GEMM (oneDNN) runs on."""
    return "amx_bf16" in _flags()


def auto_dense_formats() -> tuple[str, ...]:
    """The weight formats a text model is held in under dtype "auto" on this CPU: BF16 alone
    with native BF16, BF16 and float32 elsewhere (runtime/engine/precision.py says why)."""
    return ("bf16",) if cpu_class() == "native_bfloat16" else ("bf16", "fp32")
