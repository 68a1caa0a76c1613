"""The native CPU attention kernels (built at setup, or on first use)."""

from __future__ import annotations

from pathlib import Path

from edgefire.models.native import native_kernel

# The compiled modules, or None: attention then falls back to torch SDPA.
paged_decode_kernel = native_kernel("edgefire_paged_decode",
                                    Path(__file__).with_name("cpu_paged_decode.cpp"))
paged_prefill_kernel = native_kernel("edgefire_paged_prefill",
                                     Path(__file__).with_name("cpu_paged_prefill.cpp"))
