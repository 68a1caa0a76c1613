"""Builds this project's small C++ extensions on first use (torch caches them across runs)."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

# -march=native for AVX-512 where present; AMX explicitly off: some VMs advertise it but fault.
_FLAGS = ["-O3", "-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-fopenmp"]


@functools.cache
def load_native(name: str, source: Path) -> ModuleType | None:
    """The compiled module, or None (logged) where there is no compiler or
    EDGEFIRE_NATIVE_KERNELS=0: callers keep a pure torch/numpy path."""
    if os.environ.get("EDGEFIRE_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(name=name, sources=[str(source)], extra_cflags=_FLAGS,
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # a missing compiler must not stop the node
        log.warning("native extension %s unavailable (%s); using the fallback path", name, exc)
        return None
