"""The per-CPU choice of compute dtype behind EngineConfig(dtype="auto")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from edgefire.runtime.engine import precision
from edgefire.runtime.engine.model_runner import ModelRunner
from edgefire.runtime.engine.precision import FUSED_BFLOAT16_MAX_TOKENS, Precision

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


def test_other_cpus_widen_to_bfloat16_from_min_large_tokens(cpu):
    auto = cpu("other")
    assert [auto.for_step(n) for n in (1, 7, 8, 1024)] == [FP32, FP32, BF16, BF16]
    assert auto.for_step(1, True) == FP32


@pytest.mark.parametrize("kind", ["avx512", "avx2"])
def test_without_native_bfloat16_decode_sized_steps_run_in_bfloat16_and_the_rest_in_float32(
        cpu, kind):
    # No fast bfloat16 GEMM in torch there: only steps the fused decode kernel takes stay in
    # bfloat16.
    auto = cpu(kind)
    assert auto.for_step(1, True) == auto.for_step(FUSED_BFLOAT16_MAX_TOKENS, True) == BF16
    assert auto.for_step(FUSED_BFLOAT16_MAX_TOKENS + 1, True) == auto.for_step(1024) == FP32
    assert auto.for_step(5) == FP32  # a prompt chunk: torch's GEMM, in float32
    assert set(auto.dtypes) == {BF16, FP32} and auto.kv == BF16


def test_named_dtypes_ignore_the_cpu(cpu):
    cpu("avx2")
    assert Precision.parse("float32").dtypes == (FP32,)
    assert Precision.parse("bfloat16").dtypes == (BF16,)


def test_without_native_bfloat16_the_limit_is_the_fused_steps_rows(monkeypatch):
    from edgefire.models.fused import llama_decode

    monkeypatch.setattr(llama_decode, "has_amx", lambda: False)
    assert llama_decode.max_rows(forms=frozenset({"bf16"})) == FUSED_BFLOAT16_MAX_TOKENS


class _Model:
    """What ModelRunner asks a model before a step: whether its bfloat16 step takes prompts."""

    def __init__(self, prompts: bool) -> None:
        self.prompts = prompts

    def forward(self, input_ids, positions, meta, kv_cache, dtype=None, row_block=None): ...

    def compute_logits(self, hidden, row_block=None): ...

    def fused_prompts(self, dtype: torch.dtype) -> bool:
        return self.prompts and dtype == BF16


@pytest.mark.parametrize("kind", ["avx512", "avx2"])
@pytest.mark.parametrize("prompts", [True, False])
def test_prompt_steps_run_in_bfloat16_where_the_models_step_takes_them(cpu, prompts, kind):
    # Without native bfloat16 the fused step takes prompt chunks beside up to decode_rows
    # decodes, in bfloat16 (AVX-512: BF16, INT8 and INT4 weights; AVX2: INT8 and INT4); other
    # models keep torch's float32 GEMM for them.
    runner = ModelRunner(_Model(prompts), torch.zeros(1), 16, cpu(kind), decode_rows=64)

    def seqs(count: int, tokens: int) -> list:
        return [(SimpleNamespace(num_draft=0), tokens)] * count

    assert runner._dtype(seqs(3, 1) + seqs(1, 300)) == (BF16 if prompts else FP32)
    assert runner._dtype(seqs(2, 300)) == (BF16 if prompts else FP32)
    assert runner._dtype(seqs(65, 1) + seqs(1, 300)) == FP32  # more decodes than it takes
    assert runner._dtype(seqs(65, 1)) == FP32 and runner._dtype(seqs(64, 1)) == BF16
    native = ModelRunner(_Model(prompts), torch.zeros(1), 16, cpu("native_bfloat16"), 64)
    assert not native.small_prompts and native._dtype(seqs(1, 300)) == BF16
