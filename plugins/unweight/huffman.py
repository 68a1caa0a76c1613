"""Length-limited canonical Huffman codes over palette indices, and a chunked bitstream.

Codes are written MSB first. Every chunk of `chunk` symbols starts at a recorded bit offset,
so chunks decode independently (in parallel natively, in lockstep in the numpy fallback).
"""

from __future__ import annotations

import numpy as np

# Bytes past the end of a stream, so a decoder may always load 8 bytes at any bit position.
STREAM_PAD = 8


def code_lengths(freqs: np.ndarray, limit: int) -> np.ndarray:
    """Optimal code lengths no longer than `limit` bits (package-merge); 0 for unused symbols."""
    lengths = np.zeros(len(freqs), dtype=np.uint8)
    leaves = sorted((int(f), (s,)) for s, f in enumerate(freqs) if f > 0)
    if not leaves:
        return lengths
    if len(leaves) == 1:
        lengths[leaves[0][1][0]] = 1  # a code needs at least one bit per symbol
        return lengths
    if len(leaves) > 1 << limit:
        raise ValueError(f"{len(leaves)} symbols cannot be coded in {limit} bits")
    current = leaves
    for _ in range(limit - 1):
        # An odd item out is dropped: it cannot be paired at this level.
        pairs = zip(current[0::2], current[1::2], strict=False)
        packages = [(a[0] + b[0], a[1] + b[1]) for a, b in pairs]
        current = sorted(leaves + packages, key=lambda item: item[0])
    for _, symbols in current[:2 * len(leaves) - 2]:
        for s in symbols:
            lengths[s] += 1
    return lengths


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """Canonical code values: by (length, symbol), each code one more than the last, shifted."""
    codes = np.zeros(len(lengths), dtype=np.uint32)
    code, previous = 0, 0
    for s in sorted((s for s in range(len(lengths)) if lengths[s]), key=lambda s: (lengths[s], s)):
        code <<= int(lengths[s]) - previous
        codes[s], previous = code, int(lengths[s])
        code += 1
    return codes


def encode_stream(symbols: np.ndarray, lengths: np.ndarray,
                  chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The padded bitstream and each chunk's starting bit offset."""
    if symbols.size == 0:
        return np.zeros(STREAM_PAD, np.uint8), np.zeros(0, np.uint64)
    codes = canonical_codes(lengths)
    sym_lengths = lengths[symbols].astype(np.int64)
    ends = np.cumsum(sym_lengths)
    starts = ends - sym_lengths
    bits = np.zeros(int(ends[-1]), dtype=bool)
    # Symbol by symbol, only the one bits of its code: a scatter per set bit over that symbol's
    # positions is ~4x faster than masking every symbol once per bit position.
    order = np.argsort(symbols, kind="stable")  # a radix sort for uint8
    bounds = np.searchsorted(symbols[order], np.arange(len(lengths) + 1))
    for s, (length, code) in enumerate(zip(lengths.tolist(), codes.tolist(), strict=True)):
        at = starts[order[bounds[s]:bounds[s + 1]]]
        for b in range(length):
            if (code >> (length - 1 - b)) & 1:
                bits[at + b] = True
    stream = np.concatenate([np.packbits(bits), np.zeros(STREAM_PAD, np.uint8)])
    return stream, starts[::chunk].astype(np.uint64)


def decode_table(lengths: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(symbol, length) for every `limit`-bit window: one lookup decodes one symbol."""
    symbol = np.zeros(1 << limit, dtype=np.uint8)
    length = np.zeros(1 << limit, dtype=np.uint8)
    for s, code in enumerate(canonical_codes(lengths)):
        if lengths[s]:
            span = limit - int(lengths[s])
            symbol[int(code) << span:(int(code) + 1) << span] = s
            length[int(code) << span:(int(code) + 1) << span] = lengths[s]
    return symbol, length


def decode_lockstep(stream: np.ndarray, offsets: np.ndarray, count: int, chunk: int,
                    lengths: np.ndarray, limit: int) -> np.ndarray:
    """All chunks at once, one symbol per chunk per step: the fallback without a compiler."""
    table_symbol, table_length = decode_table(lengths, limit)
    chunks = len(offsets)
    out = np.zeros((chunks, chunk), dtype=np.uint8)
    pos = offsets.astype(np.int64)
    # The last chunk may be short; past its end it decodes padding, clipped to stay in bounds.
    end_bit = (len(stream) - 3) * 8
    data = stream.astype(np.int64)
    mask = (1 << limit) - 1
    for i in range(chunk):
        byte = pos >> 3
        window = (data[byte] << 16) | (data[byte + 1] << 8) | data[byte + 2]
        peek = (window >> (24 - limit - (pos & 7))) & mask
        out[:, i] = table_symbol[peek]
        np.minimum(pos + table_length[peek], end_bit, out=pos)
    return out.reshape(-1)[:count]
