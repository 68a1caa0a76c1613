"""The per-CPU choice of compute dtype behind EngineConfig(dtype="auto")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from edgefire.runtime.engine import precision
from edgefire.runtime.engine.model_runner import ModelRunner
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


class _Model:
    """What ModelRunner asks a model before a step: whether its bfloat16 step takes prompts."""

    def __init__(self, prompts: bool) -> None:
        self.prompts = prompts

    def forward(self, input_ids, positions, meta, kv_cache, dtype=None, row_block=None): ...

    def compute_logits(self, hidden, row_block=None): ...

    def fused_prompts(self, dtype: torch.dtype) -> bool:
        return self.prompts and dtype == BF16


@pytest.mark.parametrize("prompts", [True, False])
def test_avx2_prompt_steps_run_in_bfloat16_where_the_models_step_takes_them(cpu, prompts):
    # INT8/INT4 weights on AVX2: the fused step's integer kernels take prompt chunks beside up
    # to decode_rows decodes, in bfloat16; other models keep torch's float32 GEMM for them.
    runner = ModelRunner(_Model(prompts), torch.zeros(1), 16, cpu("avx2"), decode_rows=64)

    def seqs(count: int, tokens: int) -> list:
        return [(SimpleNamespace(num_draft=0), tokens)] * count

    assert runner._dtype(seqs(3, 1) + seqs(1, 300)) == (BF16 if prompts else FP32)
    assert runner._dtype(seqs(2, 300)) == (BF16 if prompts else FP32)
    assert runner._dtype(seqs(65, 1) + seqs(1, 300)) == FP32  # more decodes than it takes
    assert runner._dtype(seqs(65, 1)) == FP32 and runner._dtype(seqs(64, 1)) == BF16
    native = ModelRunner(_Model(prompts), torch.zeros(1), 16, cpu("native_bfloat16"), 64)
    assert not native.small_prompts and native._dtype(seqs(1, 300)) == BF16
