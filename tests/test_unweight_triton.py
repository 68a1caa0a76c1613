"""The Triton reconstructive matmul against the torch reference decoder.

Without a GPU the kernels run in triton's interpreter. `triton.jit` chooses it when a function
is decorated, triton's own `tl.*` helpers included, so TRITON_INTERPRET=1 must be set before
triton is first imported: tests/conftest.py sets it before any test module is collected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytest.importorskip("triton")

from edgefire.plugins.unweight import triton_matmul  # noqa: E402
from edgefire.plugins.unweight.inference import (  # noqa: E402
    decode_inference,
    inference_form,
    row_verbatim_start,
)


@pytest.fixture(scope="module")
def tm():
    if not triton_matmul.available():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    if DEVICE == "cpu":
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        # Catches triton imported earlier in this process without the interpreter.
        assert isinstance(tl.zeros, InterpretedFunction), "triton was imported too early"
        assert isinstance(triton_matmul._matmul_kernel, InterpretedFunction)
        assert isinstance(triton_matmul._decode_kernel, InterpretedFunction)
    return triton_matmul


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.int16)


def random_weight(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)


def special_weight() -> torch.Tensor:
    """[72, 192] with inf, nan, -0.0, denormals and huge values in a few row-chunks."""
    w = random_weight(72, 192, seed=1)
    specials = [float("inf"), float("-inf"), float("nan"), -0.0, 1e-40, -3e-39, 3e38, -1e30,
                2.0**-100, 2.0**90, -(2.0**-110), 2.0**80]
    where = [(5, 3), (5, 130), (40, 64), (71, 191), (40, 100), (5, 140), (33, 0), (71, 129),
             (5, 10), (5, 131), (40, 70), (71, 190)]
    for value, (n, col) in zip(specials, where, strict=True):
        w[n, col] = value
    return w


def plain_matmul_weight() -> torch.Tensor:
    """[80, 256], finite, with verbatim rows (rare exponents) so the matmul reads them too."""
    w = random_weight(80, 256, seed=2)
    for i, (n, col) in enumerate([(0, 0), (0, 200), (17, 70), (33, 129), (79, 255), (64, 3)]):
        w[n, col] = 2.0 ** (-60 - 3 * i) * (-1) ** i
    w[50, 10] = 1e-40  # a denormal
    w[50, 11] = 3.0e4
    return w


def counts(form) -> tuple[int, int]:
    verbatim = form.verbatim_values.shape[0]
    return verbatim, form.rows - verbatim


@pytest.mark.parametrize("block_n", [16, 32])
@pytest.mark.parametrize("make", [lambda: random_weight(80, 192, seed=0), special_weight,
                                  plain_matmul_weight], ids=["random", "special", "finite"])
def test_decode_tiles_bit_exact(tm, make, block_n):
    w = make()
    form = inference_form(w)
    assert counts(form)[1] > 0
    out = tm.decode_tiles(form, block_n=block_n, device=DEVICE)
    assert out.dtype == torch.bfloat16 and out.shape == w.shape
    assert torch.equal(bits(out), bits(decode_inference(form)))
    assert torch.equal(bits(out), bits(w))


def test_special_weights_mix_verbatim_and_plain_rows():
    for make in (special_weight, plain_matmul_weight):
        form = inference_form(make())
        verbatim, plain = counts(form)
        assert verbatim >= 3 and plain > 100
        chunks = form.verbatim_mask().view(form.shape[0], -1)
        # A running counter is tested only if one output row holds several verbatim chunks
        # and verbatim rows sit in more than one 16-row block of N.
        assert chunks.sum(1).max() >= 2
        assert len(set((chunks.any(1).nonzero().flatten() // 16).tolist())) >= 2


def test_decode_tiles_all_rows_verbatim(tm):
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(-(2**15), 2**15, (48, 128), generator=gen, dtype=torch.int32)
    w = raw.to(torch.int16).view(torch.bfloat16)
    form = inference_form(w)
    assert form.verbatim_values.shape[0] == form.rows
    out = tm.decode_tiles(form, block_n=32, device=DEVICE)
    assert torch.equal(bits(out), bits(w))


def tolerance_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x| @ |W|^T: the scale that fp32 summation error is relative to, per output."""
    return x.abs().double() @ w.abs().double().T


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("make", [plain_matmul_weight,
                                  lambda: random_weight(48, 128, seed=4)], ids=["80x256", "48x128"])
def test_matmul_fp32_matches_reference(tm, make, m):
    w = make()
    form = inference_form(w)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, w.shape[1], generator=gen)
    ref = x.double() @ decode_inference(form).double().T
    y = tm.reconstructive_matmul(x.to(DEVICE), form).cpu()
    assert y.dtype == torch.float32 and y.shape == (m, w.shape[0])
    assert ref.abs().max() > 0.1
    err = (y.double() - ref).abs()
    assert (err <= 1e-5 * tolerance_bound(x, w.float()) + 1e-30).all(), err.max()


def test_matmul_strided_x_and_given_verbatim_start(tm):
    w = plain_matmul_weight()
    form = inference_form(w)
    x = torch.randn(256, 3, generator=torch.Generator().manual_seed(7)).T  # not contiguous
    y = tm.reconstructive_matmul(x.to(DEVICE), form, row_verbatim_start(form),
                                 block_m=16, block_n=16).cpu()
    ref = x.double() @ w.double().T
    assert ((y.double() - ref).abs() <= 1e-5 * tolerance_bound(x, w.float())).all()


def test_matmul_bf16_matches_reference(tm):
    w = plain_matmul_weight()
    form = inference_form(w)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    y = tm.reconstructive_matmul(x.to(DEVICE), form).cpu()
    assert y.dtype == torch.bfloat16 and y.shape == (3, 80)
    ref = x.double() @ w.double().T
    # fp32 summation error, then one rounding to bf16: half an ulp, at most 2**-8 relative.
    fp32 = ref.abs() + 1e-5 * tolerance_bound(x.float(), w.float())
    err = (y.double() - ref).abs()
    assert (err <= 2.0**-8 * fp32 + 1e-5 * tolerance_bound(x.float(), w.float())).all()


def test_bad_inputs_raise(tm):
    form = inference_form(random_weight(16, 128, seed=5))
    with pytest.raises(ValueError, match="K = 192"):
        tm.reconstructive_matmul(torch.randn(2, 192, device=DEVICE), form)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        tm.reconstructive_matmul(torch.randn(2, 128, device=DEVICE).half(), form)
    with pytest.raises(ValueError, match="2-D"):
        tm.reconstructive_matmul(torch.randn(2, 128, device=DEVICE)[None], form)
    odd = inference_form(random_weight(8, 96, seed=6))  # rows straddle output rows
    with pytest.raises(ValueError, match="multiple of the row width"):
        tm.reconstructive_matmul(torch.randn(2, 96, device=DEVICE), odd)
    with pytest.raises(ValueError, match="multiple of the row width"):
        tm.decode_tiles(odd, device=DEVICE)
    cube = inference_form(random_weight(8, 128, seed=6).view(2, 4, 128))
    with pytest.raises(ValueError, match="2-D"):
        tm.decode_tiles(cube, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        tm.reconstructive_matmul(torch.randn(2, 128, device=DEVICE), form, block_n=24)
    with pytest.raises(ValueError, match="verbatim_start"):
        tm.reconstructive_matmul(torch.randn(2, 128, device=DEVICE), form,
                                 torch.zeros(3, dtype=torch.int32))


COMPILE_FOR_GPU = textwrap.dedent("""
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from edgefire.plugins.unweight import triton_matmul as tm
    u8 = "*u8"
    common = {"palette": u8, "packed": u8, "sign_mantissa": u8, "flags": u8,
              "verbatim": "*i16", "verbatim_start": "*i32"}
    for x, dot in (("*bf16", tl.bfloat16), ("*fp32", tl.float32)):
        sig = {"x": x, **common, "y": x, **dict.fromkeys(
            ["M", "N", "K", "stride_xm", "stride_xk", "stride_ym", "stride_yn"], "i32")}
        consts = {"ROW": 64, "BLOCK_M": 16, "BLOCK_N": 32, "DOT_DTYPE": dot}
        sig.update(dict.fromkeys(consts, "constexpr"))
        triton.compile(ASTSource(tm._matmul_kernel, sig, consts), target=GPUTarget("cuda", 90, 32))
    sig = {**common, "out": "*i16", "N": "i32", "K": "i32", "ROW": "constexpr",
           "BLOCK_N": "constexpr"}
    triton.compile(ASTSource(tm._decode_kernel, sig, {"ROW": 64, "BLOCK_N": 32}),
                   target=GPUTarget("cuda", 90, 32))
    print("compiled")
""")


def test_kernels_compile_for_a_gpu(tmp_path):
    # The interpreter checks no types (a loop-carried int32 turning int64 runs fine there and
    # fails to compile), so compile for sm_90 too: triton needs no GPU for that, only ptxas.
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
