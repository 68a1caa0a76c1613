"""The native kernels' AVX2 paths, tested on machines with AVX-512 too: the kernel tests run
again in a child process whose kernels are built for AVX2 and FMA alone
(EDGEFIRE_KERNEL_MARCH=haswell, models/native.py). Without this, the AVX2 code (a CPU
without AVX-512: many cloud instances, and some of CI's machines) is only tested where the
tests happen to run on such a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefire.contract.cpu import cpu_class

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TESTS = ["tests/test_fused_decode.py", "tests/test_attention.py", "tests/test_sampler.py"]

pytestmark = pytest.mark.slow


def test_the_kernel_tests_pass_on_an_avx2_build():
    if cpu_class() not in ("avx512", "native_bfloat16"):
        pytest.skip("no AVX-512 here: the kernels' native build is the AVX2 one (or none), "
                    "which the kernel tests run directly")
    env = {**os.environ, "EDGEFIRE_KERNEL_MARCH": "haswell"}
    isa = subprocess.run(
        [sys.executable, "-c", "from edgefire.models.fused import fused_kernels; "
                               "print(fused_kernels().isa)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True)
    assert isa.stdout.split()[-1] == "avx2", isa.stdout + isa.stderr
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *KERNEL_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
