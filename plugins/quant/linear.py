"""Weight-only quantized projections: packed integer weights, dequantized inside the matmul.

torch's CPU kernels take bfloat16 (or float32/float16) activations and run fast only in
bfloat16, so every activation is cast to bfloat16 for the kernel and back (a float32 step loses
nothing it had not already lost to the quantized weights). Scales and zero points are stored
in bfloat16 and the integers are rounded against those stored values, so the kernel reproduces
the quantization exactly. Where a kernel is missing, each call dequantizes its own layer just
in time and lets the dense copy go.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HAS_INT8_KERNEL = hasattr(torch.ops.aten, "_weight_int8pack_mm")
HAS_INT4_KERNEL = all(hasattr(torch.ops.aten, name) for name in (
    "_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"))
GROUP_SIZES = (32, 64, 128)

_KERNEL_DTYPE = torch.bfloat16


def _fit(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bfloat16 scale and zero (the value at q = 8) spanning [lo, hi] in 16 levels."""
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16)
    return scale, (lo + 8 * scale.float()).to(torch.bfloat16)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(_KERNEL_DTYPE)


@dataclass(slots=True)
class Int8Linear:
    """Symmetric per-output-channel INT8: W ≈ weight * scales[:, None]."""

    weight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # bfloat16 [out]
    use_kernel: bool = HAS_INT8_KERNEL

    @classmethod
    def quantize(cls, w: torch.Tensor, use_kernel: bool = HAS_INT8_KERNEL) -> Int8Linear:
        w = w.float()
        scales = (w.abs().amax(1) / 127).clamp(min=1e-12).to(torch.bfloat16)
        q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scales, use_kernel)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel:
            out = torch._weight_int8pack_mm(_as_rows(x), self.weight, self.scales)
            return out.view(*x.shape[:-1], -1).to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows `ids` of the dequantized weight (all of them when ids is empty), as an
        embedding lookup: the table a tied lm_head shares."""
        if ids.numel() == 0:
            return self.dequantize().to(dtype)
        flat = ids.reshape(-1).long()
        rows = self.weight[flat].float() * self.scales[flat].float()[:, None]
        return rows.to(dtype).view(*ids.shape, -1)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def int8_per_channel(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, scales) for kernels that read INT8 rows themselves (models/fused)."""
        return self.weight, self.scales

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.weight, self.scales


@dataclass(slots=True)
class Int4Linear:
    """Asymmetric group-wise INT4 along the input dimension: W ≈ (q - 8) * scale + zero.

    `zero` is the float offset torch's kernel takes (the group's value at q = 8), which is the
    usual integer zero point folded into one bfloat16 number per group.
    """

    packed: torch.Tensor  # uint8 [out, in / 2]: the kernel's layout, or two nibbles per byte
    scales_zeros: torch.Tensor  # bfloat16 [in / group_size, out, 2]
    group_size: int
    use_kernel: bool = HAS_INT4_KERNEL

    @classmethod
    def quantize(cls, w: torch.Tensor, group_size: int = 32,
                 use_kernel: bool = HAS_INT4_KERNEL) -> Int4Linear:
        out_features, in_features = w.shape
        if group_size not in GROUP_SIZES or in_features % group_size:
            raise ValueError(f"group size {group_size} must be one of {GROUP_SIZES} and divide "
                             f"the input dimension {in_features}")
        groups = w.float().reshape(out_features, in_features // group_size, group_size)
        scale, zero = _fit(groups.amin(-1), groups.amax(-1))
        q = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None] + 8)
        q = q.clamp(0, 15)
        q = q.reshape(out_features, in_features).to(torch.int32)
        if use_kernel:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        else:
            packed = (q[:, ::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        scales_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
        return cls(packed, scales_zeros, group_size, use_kernel)

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * 2

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel:
            out = torch._weight_int4pack_mm_for_cpu(_as_rows(x), self.packed, self.group_size,
                                                    self.scales_zeros)
            return out.view(*x.shape[:-1], -1).to(x.dtype)
        return F.linear(x, self.dequantize().to(x.dtype))

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the kernel multiplies by."""
        if self.use_kernel:  # the kernel's packing is opaque: read W^T back through it
            eye = torch.eye(self.in_features, dtype=_KERNEL_DTYPE)
            return torch._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size,
                                                     self.scales_zeros).t().float()
        q = torch.stack([self.packed & 15, self.packed >> 4], -1).reshape(self.packed.shape[0], -1)
        scale, zero = self.scales_zeros.float().permute(2, 1, 0)  # each [out, groups]
        groups = q.float().view(q.shape[0], -1, self.group_size) - 8
        return (groups * scale[..., None] + zero[..., None]).reshape(q.shape)

    def int4_groupwise(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """(packed, scales_zeros, rows per packing block) for kernels that read torch's CPU
        INT4 packing themselves (models/fused/gemv_int4.h); None for the plain nibbles kept
        where torch has no INT4 kernel, or a packing those kernels do not read."""
        block = int4_pack_block()
        if not self.use_kernel or block is None:
            return None
        return self.packed, self.scales_zeros, block

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.scales_zeros


@functools.cache
def int4_pack_block() -> int | None:
    """Output rows per block of torch's CPU INT4 packing in this process, or None.

    The packing follows the vector width torch dispatches to: blocks of 64 rows on AVX-512,
    byte d of a column holding row d (low nibble) and row d + 32 (high); 32 rows on AVX2, rows
    d and d + 16; adjacent row pairs without vectors (None: no block layout). Read off one
    packed weight rather than the CPU flags, since ATEN_CPU_CAPABILITY can lower the width.
    """
    if not HAS_INT4_KERNEL:
        return None
    # Row r holds r // 16 + 1, so byte 0 names the row paired with row 0.
    q = (torch.arange(64, dtype=torch.int32) // 16 + 1)[:, None].expand(64, 64).contiguous()
    high = int(torch._convert_weight_to_int4pack_for_cpu(q, 1).reshape(-1)[0]) >> 4
    return {3: 64, 2: 32}.get(high)
