"""The inference form: 12 bits per weight, every row in place, so any tile is addressable.

Row r of the flattened tensor (`row_width` weights) keeps its palette indices in
`packed[r * row_width / 2 :]` (two per byte, low nibble first) and its sign+mantissa bytes in
`sign_mantissa[r * row_width :]`. A verbatim row (bit r % 8 of `verbatim_flags[r // 8]`) holds
zeros there and takes its BF16 bits from `verbatim_values`, in row order. For a [N, K] weight
with K a multiple of `row_width`, `row_verbatim_start(form)[n]` counts the verbatim rows
before output row n, so a kernel walking K finds the next verbatim row by counting flags,
without a per-row index (the 0.5 bit/weight a 32-bit index would cost).

A BF16 weight is `(sm & 0x80) << 8 | palette[index] << 7 | (sm & 0x7F)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgefire.plugins.unweight.form import (
    PALETTE_SIZE,
    ROW_WIDTH,
    Distribution,
    decode_distribution,
)
from edgefire.plugins.unweight.native import resident_kernels

NATIVE_ROW_WIDTH = 64  # the width the native kernels are built for


@dataclass(slots=True)
class Inference:
    shape: tuple[int, ...]
    numel: int
    row_width: int
    palette: torch.Tensor  # uint8 [16] exponents, most frequent first, unused entries 0
    packed: torch.Tensor  # uint8 [rows * row_width / 2]
    sign_mantissa: torch.Tensor  # uint8 [rows * row_width]
    verbatim_flags: torch.Tensor  # uint8 [ceil(rows / 8)]
    verbatim_values: torch.Tensor  # int16 [verbatim rows, row_width]

    @property
    def rows(self) -> int:
        return -(-self.numel // self.row_width)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.palette, self.packed, self.sign_mantissa, self.verbatim_flags,
                self.verbatim_values)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def verbatim_mask(self) -> torch.Tensor:
        """bool [rows]: which rows are verbatim."""
        bits = (self.verbatim_flags[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1
        return bits.reshape(-1)[:self.rows].bool()


def inference_form(tensor: torch.Tensor, row_width: int = ROW_WIDTH) -> Inference:
    """Encode a BF16 tensor straight into the inference form."""
    if tensor.dtype != torch.bfloat16:
        raise TypeError(f"the inference form holds bfloat16 weights, not {tensor.dtype}")
    if row_width % 2:
        raise ValueError("a row must hold an even number of weights (two indices per byte)")
    words = tensor.detach().contiguous().view(torch.int16).reshape(-1)
    kernels = resident_kernels() if row_width == NATIVE_ROW_WIDTH else None
    if kernels is not None:
        counts = kernels.exponent_histogram(words).numpy()
    else:
        counts = np.bincount((words.numpy().view(np.uint16) >> 7) & 0xFF, minlength=256)
    order = np.argsort(-counts, kind="stable")[:PALETTE_SIZE]
    used = order[counts[order] > 0].astype(np.uint8)
    palette = np.zeros(PALETTE_SIZE, dtype=np.uint8)
    palette[:len(used)] = used
    lookup = np.full(256, 255, dtype=np.uint8)
    lookup[used] = np.arange(len(used), dtype=np.uint8)
    rows = -(-words.numel() // row_width)
    # Padding repeats the commonest exponent with zero sign+mantissa: never verbatim.
    pad = rows * row_width - words.numel()
    if pad:
        words = torch.cat([words, torch.full((pad,), int(palette[0]) << 7, dtype=torch.int16)])
    padded = words.view(rows, row_width)
    if kernels is not None:
        packed = torch.empty(rows * row_width // 2, dtype=torch.uint8)
        sm = torch.empty(rows * row_width, dtype=torch.uint8)
        verbatim = kernels.encode_rows(padded, torch.from_numpy(lookup), packed, sm)
    else:
        packed, sm, verbatim = _encode_rows(padded.numpy().view(np.uint16), lookup)
    flags = torch.from_numpy(np.packbits(verbatim.numpy(), bitorder="little"))
    return Inference(tuple(tensor.shape), tensor.numel(), row_width, torch.from_numpy(palette),
                     packed, sm, flags, padded[verbatim].contiguous())


def _encode_rows(words: np.ndarray, lookup: np.ndarray,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """encode_rows without the native kernel: packed indices, sign+mantissa, verbatim rows."""
    index = lookup[(words >> 7) & 0xFF]
    sm = (((words >> 8) & 0x80) | (words & 0x7F)).astype(np.uint8)
    verbatim = (index == 255).any(axis=1)
    index[verbatim] = 0
    sm[verbatim] = 0
    packed = index[:, 0::2] | (index[:, 1::2] << 4)
    return (torch.from_numpy(packed.reshape(-1)), torch.from_numpy(sm.reshape(-1)),
            torch.from_numpy(verbatim))


def to_inference_form(form: Distribution) -> Inference:
    """Transcode at load: decode the distribution form once, then pack it positionally."""
    return inference_form(decode_distribution(form), form.layout.row_width)


def decode_inference(form: Inference) -> torch.Tensor:
    """The BF16 tensor by gathering palette exponents (the vectorised torch reference)."""
    packed = form.packed.to(torch.int32)
    index = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(-1)
    exponent = form.palette.to(torch.int32)[index] << 7
    sm = form.sign_mantissa.to(torch.int32)
    bits = (exponent | ((sm & 0x80) << 8) | (sm & 0x7F)).to(torch.int16)
    bits = bits.view(form.rows, form.row_width)
    if form.verbatim_values.numel():
        bits[form.verbatim_mask()] = form.verbatim_values
    return bits.reshape(-1)[:form.numel].view(torch.bfloat16).view(form.shape)


def row_verbatim_start(form: Inference) -> torch.Tensor:
    """int32 [N]: verbatim rows before output row n of a [N, K] weight (K % row_width == 0)."""
    if len(form.shape) != 2 or form.shape[1] % form.row_width:
        raise ValueError(f"shape {form.shape} is not [N, K] with K a multiple of "
                         f"{form.row_width}")
    per_row = form.verbatim_mask().view(form.shape[0], -1).sum(1, dtype=torch.int32)
    return (torch.cumsum(per_row, 0, dtype=torch.int32) - per_row).contiguous()
