"""The native Unweight kernels (built on first use)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from models.native import load_native

_HERE = Path(__file__).parent


def decoder() -> ModuleType | None:
    """The compiled decoder, or None: decoding then uses the numpy lockstep decoder."""
    return load_native("edgefire_unweight_decode", _HERE / "unweight_decode.cpp")


def resident_kernels() -> ModuleType | None:
    """The inference-form matvec and row decoder, or None: resident weights then decode with
    torch before each matmul."""
    return load_native("edgefire_unweight_resident", _HERE / "resident_kernels.cpp")
