"""The per-CPU choice of compute dtype behind EngineConfig(dtype="auto")."""

from __future__ import annotations

import pytest
import torch

from edgefire.runtime.engine import precision
from edgefire.runtime.engine.precision import AVX2_BFLOAT16_MAX_TOKENS, Precision

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.fixture
def cpu(monkeypatch):
    def use(kind: str) -> Precision:
        monkeypatch.setattr(precision, "_cpu_class", lambda: kind)
        return Precision.parse("auto", min_large_tokens=8)
    return use


def test_native_bfloat16_computes_every_step_in_bfloat16(cpu):
    auto = cpu("native_bfloat16")
    assert {auto.for_step(n) for n in (1, 8, 1024)} == {BF16} and auto.kv == BF16


def test_avx512_without_bfloat16_widens_to_bfloat16_from_min_large_tokens(cpu):
    auto = cpu("avx512")
    assert [auto.for_step(n) for n in (1, 7, 8, 1024)] == [FP32, FP32, BF16, BF16]
    assert auto.for_step(1, True) == FP32


def test_avx2_runs_decode_sized_steps_in_bfloat16_and_the_rest_in_float32(cpu):
    # AVX2 has no fast bfloat16 GEMM: only steps the fused decode kernel takes stay in bfloat16.
    auto = cpu("avx2")
    assert auto.for_step(1, True) == auto.for_step(AVX2_BFLOAT16_MAX_TOKENS, True) == BF16
    assert auto.for_step(AVX2_BFLOAT16_MAX_TOKENS + 1, True) == auto.for_step(1024) == FP32
    assert auto.for_step(5) == FP32  # a prompt chunk: torch's GEMM, in float32
    assert set(auto.dtypes) == {BF16, FP32} and auto.kv == BF16


def test_named_dtypes_ignore_the_cpu(cpu):
    cpu("avx2")
    assert Precision.parse("float32").dtypes == (FP32,)
    assert Precision.parse("bfloat16").dtypes == (BF16,)


def test_avx2_limit_is_the_fused_steps_rows():
    from edgefire.models.fused.llama_decode import max_rows

    assert max_rows("avx2") == AVX2_BFLOAT16_MAX_TOKENS
