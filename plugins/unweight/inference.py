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

from plugins.unweight.form import PALETTE_SIZE, ROW_WIDTH, Distribution, decode_distribution


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
    flat = tensor.detach().contiguous().view(torch.int16).reshape(-1).numpy().view(np.uint16)
    exponent = ((flat >> 7) & 0xFF).astype(np.uint8)
    counts = np.bincount(exponent, minlength=256)
    order = np.argsort(-counts, kind="stable")[:PALETTE_SIZE]
    used = order[counts[order] > 0].astype(np.uint8)
    palette = np.zeros(PALETTE_SIZE, dtype=np.uint8)
    palette[:len(used)] = used
    lookup = np.full(256, 255, dtype=np.uint8)
    lookup[used] = np.arange(len(used), dtype=np.uint8)
    rows = -(-flat.size // row_width)
    pad = rows * row_width - flat.size
    # Padding repeats the commonest exponent (index 0) with zero sign+mantissa: never verbatim.
    index = np.concatenate([lookup[exponent], np.zeros(pad, np.uint8)]).reshape(rows, -1)
    sm = (((flat >> 8) & 0x80) | (flat & 0x7F)).astype(np.uint8)
    sm = np.concatenate([sm, np.zeros(pad, np.uint8)]).reshape(rows, -1)
    verbatim = (index == 255).any(axis=1)
    index[verbatim] = 0
    sm[verbatim] = 0
    values = np.zeros((int(verbatim.sum()), row_width), dtype=np.uint16)
    if values.size:
        padded = np.concatenate([flat, np.zeros(pad, np.uint16)]).reshape(rows, -1)
        values[:] = padded[verbatim]
    packed = index[:, 0::2] | (index[:, 1::2] << 4)
    flags = np.packbits(verbatim, bitorder="little")
    return Inference(tuple(tensor.shape), flat.size, row_width, torch.from_numpy(palette),
                     torch.from_numpy(packed.reshape(-1)), torch.from_numpy(sm.reshape(-1)),
                     torch.from_numpy(flags), torch.from_numpy(values.view(np.int16)))


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
