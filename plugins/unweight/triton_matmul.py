"""Reconstructive matmul: y = x @ W^T straight from the Unweight inference form.

Keeping weights compressed while resident only pays if no full BF16 copy is ever rebuilt, so
the matmul decodes each [BLOCK_N, row_width] tile of W in registers, right before `tl.dot`,
and throws it away. `decode_tiles` runs the very same decoding helper and stores the tiles:
it exists to prove the in-kernel reconstruction is bit-exact against `decode_inference`.

This module imports without triton (the kernels are then plain, never-called functions), so
`available()` can be asked anywhere; the rest of the package does not import it. On CPU the
kernels run only under TRITON_INTERPRET=1, set before triton is first imported (triton picks
the interpreter when it decorates a function, its own `tl.*` helpers included).
"""

from __future__ import annotations

import torch

from edgefire.plugins.unweight.inference import Inference, row_verbatim_start

try:
    import triton
    import triton.language as tl
except ImportError:  # kernel bodies only touch `tl` when run, and they are not run then
    triton = tl = None

_jit = triton.jit if triton is not None else (lambda fn: fn)


def available() -> bool:
    """Whether the kernels can run here: a CUDA device, or triton's CPU interpreter."""
    if triton is None:
        return False
    return torch.cuda.is_available() or _interpreted()


def _interpreted() -> bool:
    # Triton chose when it decorated the kernels; TRITON_INTERPRET set later changes nothing.
    return not isinstance(_matmul_kernel, triton.runtime.JITFunction)


@_jit
def _decode_chunk(palette, packed, sign_mantissa, flags, verbatim, offs_n, n_mask, j, count, K,
                  ROW: tl.constexpr):
    """BF16 bits (int32, 0..0xFFFF) of W[offs_n, j*ROW:(j+1)*ROW], and the verbatim counters
    advanced past this chunk. Row-chunk (n, j) is flattened row n * (K // ROW) + j."""
    cols = j * ROW + tl.arange(0, ROW)
    row = offs_n * (K // ROW) + j
    # int32, as `count` is: a loop-carried value must keep its type (row is int64).
    flag = ((tl.load(flags + row // 8, mask=n_mask, other=0) >> (row % 8)) & 1).to(tl.int32)
    mask = n_mask[:, None]
    # Two indices share a byte: both columns gather the same byte, the cache absorbs it.
    byte = tl.load(packed + offs_n[:, None] * (K // 2) + cols[None, :] // 2, mask=mask, other=0)
    index = (byte.to(tl.int32) >> ((cols[None, :] & 1) * 4)) & 0xF
    exponent = tl.load(palette + index).to(tl.int32)
    sm = tl.load(sign_mantissa + offs_n[:, None] * K + cols[None, :], mask=mask, other=0)
    sm = sm.to(tl.int32)
    bits = ((sm & 0x80) << 8) | (exponent << 7) | (sm & 0x7F)
    # Verbatim is decided per row-chunk: only flagged rows read verbatim_values at all.
    is_verbatim = flag[:, None] != 0
    raw = tl.load(verbatim + count[:, None].to(tl.int64) * ROW + tl.arange(0, ROW)[None, :],
                  mask=mask & is_verbatim, other=0)
    bits = tl.where(is_verbatim, raw.to(tl.int32) & 0xFFFF, bits)
    return bits, count + flag


@_jit
def _decode_kernel(palette, packed, sign_mantissa, flags, verbatim, verbatim_start, out, N, K,
                   ROW: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    count = tl.load(verbatim_start + offs_n, mask=n_mask, other=0)
    offs_n = offs_n.to(tl.int64)  # N * K may pass 2**31 for an embedding table
    for j in range(0, K // ROW):
        bits, count = _decode_chunk(palette, packed, sign_mantissa, flags, verbatim, offs_n,
                                    n_mask, j, count, K, ROW)
        cols = j * ROW + tl.arange(0, ROW)
        tl.store(out + offs_n[:, None] * K + cols[None, :], bits.to(tl.int16),
                 mask=n_mask[:, None])


@_jit
def _matmul_kernel(x, palette, packed, sign_mantissa, flags, verbatim, verbatim_start, y,
                   M, N, K, stride_xm, stride_xk, stride_ym, stride_yn,
                   ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_DTYPE: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    count = tl.load(verbatim_start + offs_n, mask=n_mask, other=0)
    offs_n = offs_n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K is walked in order, one row-chunk at a time: the verbatim counters are running sums.
    for j in range(0, K // ROW):
        bits, count = _decode_chunk(palette, packed, sign_mantissa, flags, verbatim, offs_n,
                                    n_mask, j, count, K, ROW)
        cols = j * ROW + tl.arange(0, ROW)
        xt = tl.load(x + offs_m[:, None] * stride_xm + cols[None, :] * stride_xk,
                     mask=m_mask[:, None], other=0.0)
        # BF16 bits << 16 is the same value in fp32, so both dot dtypes see W exactly.
        w = (bits << 16).to(tl.float32, bitcast=True).to(DOT_DTYPE)
        # "ieee" keeps fp32 x from being truncated to TF32 on GPUs; bf16 dots ignore it.
        acc = tl.dot(xt.to(DOT_DTYPE), tl.trans(w), acc, input_precision="ieee")
    tl.store(y + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
             acc.to(y.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _args(form: Inference, device: torch.device,
          verbatim_start: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    if len(form.shape) != 2:
        raise ValueError(f"the weight must be 2-D [N, K], not shape {form.shape}")
    n, k = form.shape
    if k % form.row_width:
        raise ValueError(f"K = {k} is not a multiple of the row width {form.row_width}")
    if form.row_width < 16 or form.row_width & (form.row_width - 1):
        raise ValueError(f"the row width {form.row_width} must be a power of two >= 16")
    if verbatim_start is None:
        verbatim_start = row_verbatim_start(form)
    if verbatim_start.shape != (n,):
        raise ValueError(f"verbatim_start has shape {tuple(verbatim_start.shape)}, not ({n},)")
    if triton is None:
        raise RuntimeError("the reconstructive matmul needs triton, which is not installed")
    if device.type == "cpu" and not _interpreted():
        raise RuntimeError("triton runs CPU tensors only if TRITON_INTERPRET=1 was set before "
                           "triton was imported")
    verbatim = form.verbatim_values
    if not verbatim.numel():  # never read (every load is masked), but must be a real buffer
        verbatim = torch.zeros(1, form.row_width, dtype=torch.int16)
    tensors = (form.palette, form.packed, form.sign_mantissa, form.verbatim_flags, verbatim,
               verbatim_start.to(torch.int32))
    return tuple(t.to(device).contiguous() for t in tensors)


def _check_blocks(*blocks: int) -> None:
    # tl.arange wants powers of two, and tl.dot tiles of at least 16 on GPUs.
    for block in blocks:
        if block < 16 or block & (block - 1):
            raise ValueError(f"a block size must be a power of two >= 16, not {block}")


def decode_tiles(form: Inference, *, block_n: int = 32,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """The BF16 weight [N, K], rebuilt tile by tile by the kernel-side decoder."""
    if device is None:
        device = form.palette.device
    device = torch.device(device)
    _check_blocks(block_n)
    args = _args(form, device, None)
    n, k = form.shape
    out = torch.empty(n, k, dtype=torch.int16, device=device)
    _decode_kernel[(-(-n // block_n),)](*args, out, n, k, ROW=form.row_width, BLOCK_N=block_n)
    return out.view(torch.bfloat16)


def reconstructive_matmul(x: torch.Tensor, form: Inference,
                          verbatim_start: torch.Tensor | None = None, *, block_m: int = 16,
                          block_n: int = 32) -> torch.Tensor:
    """y = x @ W^T for x [M, K] (float32 or bfloat16), accumulated in fp32, in x's dtype.

    `verbatim_start` is `row_verbatim_start(form)`; pass it in to compute it once per weight.
    """
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"x must be float32 or bfloat16, not {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], not shape {tuple(x.shape)}")
    if len(form.shape) == 2 and x.shape[1] != form.shape[1]:
        raise ValueError(f"x has K = {x.shape[1]} but the weight {form.shape} has "
                         f"K = {form.shape[1]}")
    _check_blocks(block_m, block_n)
    args = _args(form, x.device, verbatim_start)
    n, k = form.shape
    m = x.shape[0]
    # The interpreter multiplies bf16 dot operands as raw uint16 bits (triton-lang/triton#11584)
    # and narrows fp32 to bf16 by truncating: there, dot in fp32 and let torch round the output.
    interpreted = _interpreted()
    bf16_dot = x.dtype == torch.bfloat16 and not interpreted
    y = torch.empty(m, n, dtype=torch.float32 if interpreted else x.dtype, device=x.device)
    grid = (-(-m // block_m), -(-n // block_n))
    _matmul_kernel[grid](x, *args, y, m, n, k, x.stride(0), x.stride(1), y.stride(0),
                         y.stride(1), ROW=form.row_width, BLOCK_M=block_m, BLOCK_N=block_n,
                         DOT_DTYPE=tl.bfloat16 if bf16_dot else tl.float32)
    return y.to(x.dtype)
