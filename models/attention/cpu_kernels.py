"""The native CPU attention kernels (built on first use)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from models.native import load_native

_SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")


def paged_decode_kernel() -> ModuleType | None:
    """The compiled paged-decode module, or None: attention then falls back to torch SDPA."""
    return load_native("edgefire_paged_decode", _SOURCE)
