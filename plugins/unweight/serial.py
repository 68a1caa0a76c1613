"""The distribution form as bytes: header, then sections, widest element type first.

Sections after the 8-byte-aligned header: chunk offsets (u64), verbatim row numbers (u32),
verbatim values (u16), palette (u8), code lengths (u8), bitstream, sign+mantissa bytes. Widest
first keeps every section aligned for zero-copy views.
"""

from __future__ import annotations

import struct

import numpy as np

from edgefire.plugins.unweight.form import Distribution, Layout

MAGIC = b"UWD1"
# magic, ndim, palette size, max code bits, row width, chunk, numel, verbatim rows, chunks,
# stream bytes
_HEADER = struct.Struct("<4sBBBxHxxIQQQQ")


def to_bytes(form: Distribution) -> bytes:
    layout = form.layout
    header = _HEADER.pack(MAGIC, len(layout.shape), len(layout.palette), form.max_bits,
                          layout.row_width, form.chunk, layout.numel, len(layout.verbatim_rows),
                          len(form.offsets), len(form.stream))
    shape = struct.pack(f"<{len(layout.shape)}Q", *layout.shape)
    parts = [header, shape, form.offsets.astype("<u8"), layout.verbatim_rows.astype("<u4"),
             layout.verbatim_values.astype("<u2"), layout.palette, form.lengths, form.stream,
             layout.sign_mantissa]
    return b"".join(part if isinstance(part, bytes) else part.tobytes() for part in parts)


def from_bytes(data: bytes | bytearray | memoryview) -> Distribution:
    """Parse; the arrays view `data` when it is writable (a bundle's buffers are), else a
    private copy of it: torch only wraps writable arrays."""
    writable = isinstance(data, bytearray) or (isinstance(data, memoryview)
                                               and not data.readonly)
    buffer = data if writable else bytearray(data)
    (magic, ndim, palette_size, max_bits, row_width, chunk, numel, verbatim, chunks,
     stream_bytes) = _HEADER.unpack_from(buffer)
    if magic != MAGIC:
        raise ValueError(f"not an unweight distribution blob (magic {magic!r})")
    at = _HEADER.size
    shape = struct.unpack_from(f"<{ndim}Q", buffer, at)
    at += 8 * ndim
    rows = -(-numel // row_width)
    count = (rows - verbatim) * row_width

    def take(dtype: str, n: int) -> np.ndarray:
        nonlocal at
        array = np.frombuffer(buffer, dtype=dtype, count=n, offset=at)
        at += array.nbytes
        return array

    offsets = take("<u8", chunks)
    verbatim_rows = take("<u4", verbatim)
    verbatim_values = take("<u2", verbatim * row_width).reshape(verbatim, row_width)
    palette = take("u1", palette_size)
    lengths = take("u1", palette_size)
    stream = take("u1", stream_bytes)
    sign_mantissa = take("u1", count)
    layout = Layout(tuple(shape), numel, row_width, palette, verbatim_rows, verbatim_values,
                    sign_mantissa)
    return Distribution(layout, lengths, chunk, max_bits, offsets, stream)
