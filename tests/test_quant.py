"""Weight-only quantization: error bounds, kernels against the dequantized reference, and on
SmolLM2 (slow) loading through the codecs, coherent generation and perplexity targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from edgefire.plugins.quant import QuantCodec
from edgefire.plugins.quant.linear import HAS_INT4_KERNEL, HAS_INT8_KERNEL, Int4Linear, Int8Linear

TEXT = Path(__file__).parent / "data" / "perplexity.txt"
MODEL = "@cf/huggingfacetb/smollm2-135m-instruct"


def _weight(out_features: int = 96, in_features: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


def test_int8_error_is_within_half_a_step() -> None:
    w = _weight()
    q = Int8Linear.quantize(w)
    step = w.abs().amax(1, keepdim=True) / 127
    # Half a step of rounding, plus the bfloat16 rounding of the scale at the row's extreme.
    assert ((q.dequantize() - w).abs() <= step * 0.5 + w.abs().amax(1, keepdim=True) / 256).all()
    assert q.weight.dtype == torch.int8 and q.scales.dtype == torch.bfloat16


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_is_within_half_a_step(group_size: int) -> None:
    w = _weight()
    q = Int4Linear.quantize(w, group_size, use_kernel=False)
    groups = w.view(w.shape[0], -1, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    err = (q.dequantize() - w).abs().view_as(groups)
    assert (err <= step[..., None] * 0.51 + groups.abs().amax(-1, keepdim=True) / 128).all()
    assert q.packed.numel() == w.numel() // 2


def test_int4_rejects_group_sizes_that_do_not_divide_the_input() -> None:
    with pytest.raises(ValueError, match="group size"):
        Int4Linear.quantize(_weight(8, 96), 64)
    with pytest.raises(ValueError, match="group size"):
        Int4Linear.quantize(_weight(8, 96), 16)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    # The kernels compute in bfloat16 (8 bits of mantissa) whatever the activations' dtype.
    assert out.dtype == dtype and out.shape == ref.shape
    assert (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max()


@pytest.mark.skipif(not HAS_INT8_KERNEL, reason="no int8 weight kernel in this torch")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 32])
def test_int8_kernel_matches_dequantized_matmul(dtype: torch.dtype, rows: int) -> None:
    q = Int8Linear.quantize(_weight())
    x = torch.randn(rows, 256).to(dtype)
    ref = x.float() @ q.dequantize().T
    _close(q.linear(x), ref, dtype)
    _close(Int8Linear(q.weight, q.scales, use_kernel=False).linear(x), ref, dtype)


@pytest.mark.skipif(not HAS_INT4_KERNEL, reason="no int4 weight kernel in this torch")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_kernel_matches_dequantized_matmul(dtype: torch.dtype, group_size: int) -> None:
    w = _weight()
    kernel = Int4Linear.quantize(w, group_size, use_kernel=True)
    fallback = Int4Linear.quantize(w, group_size, use_kernel=False)
    assert torch.equal(kernel.scales_zeros, fallback.scales_zeros)
    # The kernel's opaque packing holds the same integers as the plain nibbles.
    assert torch.allclose(kernel.dequantize(), fallback.dequantize(), rtol=1e-2, atol=1e-2)
    for rows in (1, 5, 32):
        x = torch.randn(rows, 256).to(dtype)
        ref = x.float() @ fallback.dequantize().T
        _close(kernel.linear(x), ref, dtype)
        _close(fallback.linear(x), ref, dtype)


def test_codec_names_precision_and_stored_form() -> None:
    w = _weight()
    codec = QuantCodec("int4", 4, 32)
    assert codec.precision == "int4-g32" and QuantCodec("int8", 8).precision == "int8"
    assert codec.decode(codec.encode(w)) is w  # storage untouched: only the resident form
    y = codec.to_resident(w).linear(torch.randn(3, 256))
    assert y.shape == (3, 96)


def test_unquantized_layers_still_take_dense_tensors() -> None:
    from edgefire.models.llama import _linear

    w, x = _weight(), torch.randn(4, 256)
    assert torch.equal(_linear(x, w), F.linear(x, w))


@pytest.fixture(scope="module")
def loaded():
    from edgefire.contract.catalog import Catalog
    from edgefire.plugins.quant.evaluate import load_with_codec
    from edgefire.runtime.engine.precision import Precision

    spec = Catalog.load().get_runnable(MODEL)
    precision = Precision.parse("bfloat16")
    return {codec: load_with_codec(spec, codec, precision)
            for codec in ("identity", "int8", "int4")}


@pytest.mark.slow
def test_quantized_models_report_precision_and_shrink(loaded) -> None:
    assert loaded["identity"].model.weight_precision == "bfloat16"
    assert loaded["int8"].model.weight_precision == "int8"
    assert loaded["int4"].model.weight_precision == "int4-g32"
    dense = loaded["identity"].model.weight_bytes
    assert loaded["int4"].model.weight_bytes < loaded["int8"].model.weight_bytes < dense


@pytest.mark.slow
def test_catalog_variants_state_the_precision_their_models_report(loaded) -> None:
    from edgefire.contract.catalog import Catalog
    from edgefire.runtime.weight_precision import stated_precision

    catalog = Catalog.load()
    for codec, name in (("identity", MODEL), ("int8", f"{MODEL}-int8"), ("int4", f"{MODEL}-int4")):
        spec = catalog.get_runnable(name)
        assert spec.codec == codec and spec.weights == catalog.get(MODEL).weights
        # `loaded` holds dense weights in bfloat16.
        assert stated_precision(spec, "bfloat16") == loaded[codec].model.weight_precision


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_quantized_models_generate_coherent_text(loaded, codec: str) -> None:
    from edgefire.runtime.engine.llm_engine import EngineConfig
    from edgefire.runtime.engine.sampling_params import SamplingParams
    from edgefire.runtime.loading import create_engine

    lm = loaded[codec]
    engine = create_engine(lm, EngineConfig(dtype="bfloat16"))
    engine.add_request("q", lm.tokenizer.encode("The capital of France is"),
                       SamplingParams(max_tokens=12, temperature=0))
    text = "".join(out.text for _ in range(64) if engine.has_unfinished()
                   for out in engine.step())
    assert "Paris" in text


@pytest.mark.slow
def test_perplexity_within_targets(loaded) -> None:
    from edgefire.plugins.quant.evaluate import perplexity

    text = TEXT.read_text()
    ppl = {codec: perplexity(lm.model, lm.tokenizer.encode(text)) for codec, lm in loaded.items()}
    assert ppl["identity"] < 60  # the text reads as English to the model
    assert ppl["int8"] <= ppl["identity"] * 1.01
    assert ppl["int4"] <= ppl["identity"] * 1.08
