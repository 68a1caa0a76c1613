"""Weights resident in the Unweight inference form: exact decoding, the fused matvec kernel,
the autotuner, and SmolLM2 served from compressed weights."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from edgefire.contract.catalog import Catalog
from edgefire.plugins.unweight import autotune
from edgefire.plugins.unweight.inference import _encode_rows, decode_inference, inference_form
from edgefire.plugins.unweight.native import resident_kernels
from edgefire.plugins.unweight.resident import UnweightLinear
from edgefire.runtime.engine.sampling_params import SamplingParams
from edgefire.runtime.llm import LLM
from edgefire.runtime.weights.warm_cache import cache_root

SMOLLM = "@cf/huggingfacetb/smollm2-135m-instruct"
needs_kernels = pytest.mark.skipif(resident_kernels() is None, reason="no native kernels")


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int16)


def _weight(n: int, k: int, seed: int = 0, specials: bool = True) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=generator) * 0.02).to(torch.bfloat16)
    if specials:  # exponents outside any palette: their rows must go verbatim
        w[1, 3], w[n - 1, k - 1], w[n // 2, 70] = float("inf"), 3e38, -1e-40
    return w


def _resident(weight: torch.Tensor, fused_max_rows: int) -> UnweightLinear:
    resident = UnweightLinear.from_weight(weight, tune=False)
    resident.fused_max_rows = fused_max_rows
    return resident


@needs_kernels
def test_native_encoder_matches_the_reference():
    w = _weight(96, 192)
    form = inference_form(w)
    words = _bits(w).view(-1, 64).numpy().view("uint16")
    lookup = torch.full((256,), 255, dtype=torch.uint8)
    lookup[form.palette.long()] = torch.arange(16, dtype=torch.uint8)  # all 16 in use here
    packed, sm, verbatim = _encode_rows(words, lookup.numpy())
    assert torch.equal(form.packed, packed) and torch.equal(form.sign_mantissa, sm)
    assert torch.equal(form.verbatim_mask(), verbatim) and 0 < int(verbatim.sum()) < 96 * 3


@pytest.mark.parametrize("shape", [(64, 128), (33, 576), (7, 5, 67)])
def test_inference_form_round_trips(shape):
    w = _weight(shape[0], shape[-1]) if len(shape) == 2 else torch.randn(shape).bfloat16()
    assert torch.equal(_bits(decode_inference(inference_form(w))), _bits(w))


@needs_kernels
def test_rows_and_whole_weight_decode_bit_exactly():
    w = _weight(80, 256)
    resident = _resident(w, 0)
    assert resident.form.verbatim_values.shape[0] >= 3
    assert torch.equal(_bits(resident.decode()), _bits(w))
    ids = torch.tensor([[1, 79], [40, 0]])
    rows = resident.rows(ids)
    assert rows.shape == (2, 2, 256) and torch.equal(_bits(rows), _bits(w[ids]))
    assert resident.rows(ids, torch.float32).dtype == torch.float32


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_and_decoded_matmuls_agree_with_the_dense_weight(rows, dtype):
    w = _weight(70, 192, specials=False)
    w[5, :64] = torch.linspace(-3, 3, 64).exp2().bfloat16() * 1e-30  # a verbatim row
    x = torch.randn(2, rows, 192).to(dtype)
    reference = x.float() @ w.float().T
    for fused_max_rows in (0, 1000):
        resident = _resident(w, fused_max_rows)
        assert resident.form.verbatim_values.shape[0] > 0
        out = resident.linear(x)
        assert out.shape == (2, rows, 70) and out.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out.float(), reference, rtol=tolerance, atol=tolerance)


def test_without_native_kernels_torch_decodes_before_each_use(monkeypatch):
    w = _weight(40, 128)
    resident = UnweightLinear.from_weight(w)  # tuned with kernels, where there are any
    monkeypatch.setattr("edgefire.plugins.unweight.resident.resident_kernels", lambda: None)
    assert torch.equal(_bits(resident.decode()), _bits(w))
    assert torch.equal(_bits(resident.rows(torch.tensor([1, 39]))), _bits(w[[1, 39]]))
    x = torch.randn(3, 128)
    w[1, 3] = 0  # the inf would turn the reference into NaNs
    out = UnweightLinear.from_weight(w).linear(x)
    torch.testing.assert_close(out, x @ w.float().T, rtol=1e-5, atol=1e-5)


def test_crossover_is_measured_once_and_stored(monkeypatch):
    def fused(x):  # slower than `unfused` past four rows
        time.sleep(0.001 * x.shape[0])

    def unfused(x):
        time.sleep(0.0055)

    assert autotune.measure_crossover(fused, unfused, 8, torch.float32) == 4
    assert autotune.measure_crossover(unfused, fused, 8, torch.float32) == 0
    calls = []
    shape = (123, 456)

    def measure():
        calls.append(1)
        return 32

    assert autotune.crossover(shape, torch.bfloat16, measure) == 32
    assert autotune.crossover(shape, torch.bfloat16, measure) == 32
    assert calls == [1]
    stored = json.loads((cache_root() / "unweight-autotune.json").read_text())
    assert [v for k, v in stored.items() if k.endswith("/bfloat16/123x456")] == [32]


@pytest.mark.slow
@needs_kernels
def test_smollm2_serves_from_compressed_weights():
    spec = Catalog.load().get(SMOLLM)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    runs = {}
    for codec in ("identity", "unweight"):
        catalog = Catalog([dataclasses.replace(spec, codec=codec)])
        llm = LLM(SMOLLM, dtype="float32", catalog=catalog)
        model = llm.model
        runs[codec] = (model, [r.token_ids for r in llm.generate(prompts, params)])
    (dense, dense_tokens), (packed, packed_tokens) = runs["identity"], runs["unweight"]
    assert packed.weight_precision == "bfloat16-unweight"
    # Every 2-D weight (embeddings included) held at ~12 of 16 bits.
    assert packed.weight_bytes <= 0.78 * dense.weight_bytes
    # float32 matmuls differ from the dense ones only in summation order: same greedy text.
    assert packed_tokens == dense_tokens
