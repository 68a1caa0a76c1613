"""The native Unweight kernels (built at setup, or on first use)."""

from __future__ import annotations

from pathlib import Path

from edgefire.models.native import native_kernel

_HERE = Path(__file__).parent

# The compiled decoder, or None: decoding then uses the numpy lockstep decoder.
decoder = native_kernel("edgefire_unweight_decode", _HERE / "unweight_decode.cpp")

# The inference-form matvec and row decoder, or None: resident weights then decode with torch
# before each matmul.
resident_kernels = native_kernel("edgefire_unweight_resident", _HERE / "resident_kernels.cpp")
