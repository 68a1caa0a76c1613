"""The native kernels' paths for other CPUs, tested on machines with more: the kernel tests run
again in a child process whose kernels are built for another target (EDGEFIRE_KERNEL_MARCH,
models/native.py): AVX2 and FMA alone (haswell), and AVX-512 without BF16 dot products
(icelake-server: the pairs widened to float32, gemm_packed.h). Without this, such a CPU's code
(many cloud instances, and some of CI's machines) is only tested where the tests happen to run
on one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefire.contract.cpu import _flags

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TESTS = ["tests/test_fused_decode.py", "tests/test_attention.py", "tests/test_sampler.py"]
# What each target's build may use, as /proc/cpuinfo names it: the CPU must have it all.
TARGETS = {
    "haswell": ("avx2", {"avx2", "fma", "avx512f"}),
    "icelake-server": ("avx512", {
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vbmi",
        "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512ifma", "gfni", "vaes",
        "vpclmulqdq", "sha_ni", "avx512_bf16"}),
}

pytestmark = pytest.mark.slow


def _isa(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from edgefire.models.fused import fused_kernels; "
                               "print(fused_kernels().isa)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True)
    return done.stdout.split()[-1]


@pytest.mark.parametrize("march", TARGETS)
def test_the_kernel_tests_pass_on_another_targets_build(march):
    isa, needs = TARGETS[march]
    # A CPU with more than the target (AVX-512 for haswell's build, BF16 dot products for
    # icelake-server's), whose own build is another: else the native build is this one, which
    # the kernel tests run directly.
    if not needs <= _flags():
        pytest.skip(f"this CPU's own build is the {isa} one (or it lacks some of {march}'s "
                    "instructions): the kernel tests run it directly")
    env = {**os.environ, "EDGEFIRE_KERNEL_MARCH": march}
    assert _isa(env) == isa
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *KERNEL_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
