"""This project's small C++ extensions: declared by the modules that use them, built once at
setup (`edgefire build-kernels`, which `make run`/`make test` run) or else on first use.

Each build is named by a digest of its source's path and text (and of the headers it includes
with quotes), the flags and torch's version,
so two checkouts on one machine (a CI clone beside a working copy) keep separate builds
instead of rebuilding each other's on every switch, and an edited kernel never loads stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

# -march=native for AVX-512 where present; AMX explicitly off: some VMs advertise it but fault.
# EDGEFIRE_KERNEL_MARCH names another target (e.g. haswell: AVX2 and FMA, no AVX-512;
# icelake-server: AVX-512 without BF16 dot products), so a machine with more can build and test
# the kernels' paths for those too.
def _flags() -> list[str]:
    march = os.environ.get("EDGEFIRE_KERNEL_MARCH", "native")
    return ["-O3", f"-march={march}", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16",
            "-fopenmp"]


_DECLARED: dict[str, Path] = {}
_unavailable: list[str] = []  # kernels that failed to build in this process


def native_kernel(name: str, source: Path) -> Callable[[], ModuleType | None]:
    """Declare a kernel (so setup can prebuild it) and return its loader."""
    _DECLARED[name] = source
    return functools.partial(load_native, name, source)


def declared_kernels() -> dict[str, Path]:
    """The kernels declared by the modules imported so far, by name."""
    return dict(_DECLARED)


@functools.cache
def load_native(name: str, source: Path) -> ModuleType | None:
    """The compiled module, or None where there is no compiler or EDGEFIRE_NATIVE_KERNELS=0:
    callers keep a pure torch/numpy path."""
    if os.environ.get("EDGEFIRE_NATIVE_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import _get_build_directory, load

        build = build_name(name, source)
        folder = Path(_get_build_directory(build, verbose=False))
        with _only_builder(folder):
            return load(name=build, sources=[str(source)], extra_cflags=_flags(),
                        extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
    except Exception as exc:  # a missing compiler must not stop the node
        _fallback_notice(name, exc)
        return None


@contextlib.contextmanager
def _only_builder(folder: Path) -> Iterator[None]:
    """Hold the build folder for this process alone, and clear a baton its last holder left.

    torch's load() takes its folder's `lock` file for the build and waits, forever, while one
    exists; a process killed in between (a node stopped while loading its kernels) leaves it,
    and from then on every process that loads that kernel hangs. An flock is let go when its
    process dies: whoever holds it is the only edgefire process in load() for this folder, so a
    baton found then is a dead one's."""
    with open(folder / "edgefire.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        baton = folder / "lock"
        if baton.exists():
            log.warning("removing %s, left by a process that stopped while building", baton)
            baton.unlink(missing_ok=True)
        yield


def build_name(name: str, source: Path) -> str:
    import torch

    digest = hashlib.sha256()
    for part in (str(source.resolve()).encode(), *_texts(source), " ".join(_flags()).encode(),
                 torch.__version__.encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    return f"{name}_{digest.hexdigest()[:12]}"


_LOCAL_INCLUDE = re.compile(rb'^#include "([^"]+)"', re.MULTILINE)


def _texts(source: Path, seen: set[Path] | None = None) -> Iterator[bytes]:
    """The source's text, then each header it includes with quotes (this project's own), once
    each: an edited header must rebuild every kernel that uses it."""
    seen = set() if seen is None else seen
    source = source.resolve()
    if source in seen:
        return
    seen.add(source)
    text = source.read_bytes()
    yield text
    for name in _LOCAL_INCLUDE.findall(text):
        yield from _texts(source.parent / name.decode(), seen)


def _fallback_notice(name: str, exc: Exception) -> None:
    # Said once per process, at warning level: a user should know why it is slower, not be
    # told three times.
    if not _unavailable:
        log.warning("native kernels unavailable (%s: %s); using the slower torch fallback "
                    "paths", name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    else:
        log.debug("native kernel %s unavailable too: %s", name, exc)
    _unavailable.append(name)
