"""Builds the native Unweight decoder on first use (cached by torch across runs)."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("unweight_decode.cpp")
# -march=native for AVX-512 where present; AMX explicitly off: some VMs advertise it but fault.
_FLAGS = ["-O3", "-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-fopenmp"]


@functools.cache
def decoder() -> ModuleType | None:
    """The compiled module, or None (logged) where no compiler is available."""
    if os.environ.get("EDGEFIRE_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(name="edgefire_unweight_decode", sources=[str(_SOURCE)],
                    extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # a missing compiler must not stop the node
        log.warning("native unweight decoder unavailable (%s); using the numpy decoder", exc)
        return None
