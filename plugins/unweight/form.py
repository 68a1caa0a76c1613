"""The Unweight BF16 format: exponent palette, verbatim rows, and its two encoded forms.

Each BF16 weight splits into an exponent byte and a sign+mantissa byte (kept raw). Exponents
map onto a per-tensor palette of the 16 most frequent values; a row (`row_width` weights of
the flattened tensor) holding any other exponent is kept verbatim, so decoding branches once
per row. The distribution form Huffman-codes the palette indices of the other rows (the
inference form, in inference.py, packs them four bits each). The last row is padded with the
commonest exponent, so rows are whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgefire.plugins.unweight import huffman
from edgefire.plugins.unweight.native import decoder

PALETTE_SIZE = 16
ROW_WIDTH = 64
CHUNK_SYMBOLS = 16384
# 12 bits keeps the decode table (4 K entries) in L1; the limit costs ~nothing on real weights.
MAX_CODE_BITS = 12
# Below this the header and tables outweigh any saving: such tensors stay as they are.
MIN_NUMEL = 256


@dataclass(slots=True)
class Passthrough:
    """A tensor the codec does not compress (not BF16, or too small)."""

    tensor: torch.Tensor


@dataclass(slots=True)
class Layout:
    """What both forms share: shape, palette, verbatim rows and the raw sign+mantissa bytes."""

    shape: tuple[int, ...]
    numel: int
    row_width: int
    palette: np.ndarray  # uint8 exponents, most frequent first
    verbatim_rows: np.ndarray  # uint32 row numbers, ascending
    verbatim_values: np.ndarray  # uint16 (len(verbatim_rows), row_width)
    sign_mantissa: np.ndarray  # uint8, one per weight of the coded rows

    @property
    def rows(self) -> int:
        return -(-self.numel // self.row_width)

    def coded_rows(self) -> np.ndarray:
        keep = np.ones(self.rows, dtype=bool)
        keep[self.verbatim_rows] = False
        return np.flatnonzero(keep)

    def assemble(self, coded: torch.Tensor | None) -> torch.Tensor:
        """The BF16 tensor from the int16 coded rows (already placed when None) and verbatim."""
        out = torch.empty((self.rows, self.row_width), dtype=torch.int16)
        if coded is not None:
            out[torch.from_numpy(self.coded_rows())] = coded.view(-1, self.row_width)
        if len(self.verbatim_rows):
            out[torch.from_numpy(self.verbatim_rows.astype(np.int64))] = torch.from_numpy(
                self.verbatim_values.view(np.int16))
        return out.view(-1)[:self.numel].view(torch.bfloat16).view(self.shape)


@dataclass(slots=True)
class Distribution:
    """Huffman-coded palette indices in independently decodable chunks."""

    layout: Layout
    lengths: np.ndarray  # uint8 code length per palette entry
    chunk: int
    max_bits: int
    offsets: np.ndarray  # uint64 starting bit of each chunk
    stream: np.ndarray  # uint8, padded by huffman.STREAM_PAD bytes


def _split(tensor: torch.Tensor, row_width: int) -> tuple[Layout, np.ndarray]:
    """The layout and the palette index of every coded weight."""
    flat = tensor.detach().contiguous().view(torch.int16).reshape(-1).numpy().view(np.uint16)
    counts = np.bincount((flat >> 7) & 0xFF, minlength=256)
    order = np.argsort(-counts, kind="stable")[:PALETTE_SIZE]
    palette = order[counts[order] > 0].astype(np.uint8)
    rows = -(-flat.size // row_width)
    padded = np.full(rows * row_width, int(palette[0]) << 7, dtype=np.uint16)
    padded[:flat.size] = flat
    padded = padded.reshape(rows, row_width)
    lookup = np.full(256, 255, dtype=np.uint8)
    lookup[palette] = np.arange(len(palette), dtype=np.uint8)
    index = lookup[(padded >> 7) & 0xFF]
    verbatim = (index == 255).any(axis=1)
    coded = padded[~verbatim]
    sign_mantissa = (((coded >> 8) & 0x80) | (coded & 0x7F)).astype(np.uint8).reshape(-1)
    layout = Layout(tuple(tensor.shape), flat.size, row_width, palette,
                    np.flatnonzero(verbatim).astype(np.uint32), padded[verbatim].copy(),
                    sign_mantissa)
    return layout, index[~verbatim].reshape(-1)


def encode(tensor: torch.Tensor, row_width: int = ROW_WIDTH, chunk: int = CHUNK_SYMBOLS,
           max_bits: int = MAX_CODE_BITS) -> Distribution | Passthrough:
    if tensor.dtype != torch.bfloat16 or tensor.numel() < MIN_NUMEL:
        return Passthrough(tensor)
    if chunk % row_width:
        raise ValueError("a chunk must hold whole rows")
    layout, symbols = _split(tensor, row_width)
    lengths = huffman.code_lengths(np.bincount(symbols, minlength=len(layout.palette)), max_bits)
    stream, offsets = huffman.encode_stream(symbols, lengths, chunk)
    return Distribution(layout, lengths, chunk, max_bits, offsets, stream)


def _exponent_bits(palette: np.ndarray) -> np.ndarray:
    return palette.astype(np.int32) << 7


def _combine(exponent: torch.Tensor, sign_mantissa: np.ndarray) -> torch.Tensor:
    sm = torch.from_numpy(sign_mantissa).to(torch.int32)
    return (exponent | ((sm & 0x80) << 8) | (sm & 0x7F)).to(torch.int16)


def decode_distribution(form: Distribution, threads: int | None = None,
                        native: bool = True) -> torch.Tensor:
    layout = form.layout
    count = layout.sign_mantissa.size
    module = decoder() if native else None
    if count == 0:
        return layout.assemble(None)
    if module is None:
        symbols = huffman.decode_lockstep(form.stream, form.offsets, count, form.chunk,
                                          form.lengths, form.max_bits)
        exponent = torch.from_numpy(_exponent_bits(layout.palette)[symbols])
        return layout.assemble(_combine(exponent, layout.sign_mantissa))
    symbol, length = huffman.decode_table(form.lengths, form.max_bits)
    table = (length.astype(np.int32) << 16) | _exponent_bits(layout.palette)[symbol]
    rows = layout.rows
    out = torch.empty(rows * layout.row_width, dtype=torch.int16)
    module.decode(torch.from_numpy(form.stream), torch.from_numpy(form.offsets.view(np.int64)),
                  torch.from_numpy(layout.sign_mantissa), torch.from_numpy(table),
                  torch.from_numpy(layout.coded_rows()), out, count, form.chunk,
                  layout.row_width, form.max_bits, threads or torch.get_num_threads())
    if len(layout.verbatim_rows):
        out.view(rows, -1)[torch.from_numpy(layout.verbatim_rows.astype(np.int64))] = (
            torch.from_numpy(layout.verbatim_values.view(np.int16)))
    return out[:layout.numel].view(torch.bfloat16).view(layout.shape)
