"""Native kernels: builds keyed so checkouts never evict each other; setup prebuilds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgefire.models.native import build_name


def test_build_names_differ_by_checkout_and_by_source(tmp_path):
    one, two = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    for path in (one, two):
        path.parent.mkdir()
        path.write_text("int f() { return 1; }\n")
    assert build_name("k", one) == build_name("k", one)
    assert build_name("k", one) != build_name("k", two)  # same text, another checkout
    before = build_name("k", one)
    one.write_text("int f() { return 2; }\n")
    assert build_name("k", one) != before  # an edit never loads a stale build
    assert before.startswith("k_")


def test_an_edited_header_changes_the_build_name(tmp_path):
    source, header = tmp_path / "k.cpp", tmp_path / "inc" / "k.h"
    header.parent.mkdir()
    source.write_text('#include <vector>\n#include "inc/k.h"\nint f() { return g(); }\n')
    header.write_text("inline int g() { return 1; }\n")
    before = build_name("k", source)
    header.write_text("inline int g() { return 2; }\n")
    assert build_name("k", source) != before


def test_build_kernels_prebuilds_every_declared_kernel():
    done = subprocess.run([sys.executable, "-m", "edgefire.runtime.cli", "build-kernels"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for name in ("edgefire_paged_decode", "edgefire_fused_decode", "edgefire_unweight_decode",
                 "edgefire_unweight_resident", "edgefire_sampling"):
        assert f"native kernel {name} ... ready" in done.stdout


def test_a_baton_left_by_a_killed_build_does_not_hang_the_next_load():
    # torch's load() waits while its build folder holds a `lock` file; a process killed while
    # loading leaves one, and every later load of that kernel hung on it for good.
    from torch.utils.cpp_extension import _get_build_directory

    from edgefire.runtime.engine.sampler import sampling_kernel

    name, source = sampling_kernel.args
    baton = Path(_get_build_directory(build_name(name, source), verbose=False)) / "lock"
    baton.touch()
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from edgefire.runtime.engine.sampler import sampling_kernel\n"
             "assert sampling_kernel() is not None"],
            capture_output=True, text=True, timeout=120)
    finally:
        left = baton.exists()
        baton.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr
    assert not left
    assert "left by a process that stopped while building" in done.stderr
