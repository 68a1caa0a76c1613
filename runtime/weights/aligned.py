"""Weights on cache-line boundaries, on disk and in memory.

A memory-mapped safetensors tensor starts wherever the file puts it: after an 8-byte length
and a JSON header of arbitrary length, so 8-byte aligned at best. torch allocates on 64-byte
boundaries. So a model loaded from the warm cache held every weight 16 bytes off the lines the
same model converted fresh held it on: each 64-byte vector load of the native kernels spanned
two cache lines, and the two loads were not the same input to torch's GEMM (on an AMX machine
CI saw them give one prompt different logits; the weights' placement was the one difference
found between them). The writer pads the header so the data section starts on a 64-byte
boundary, which aligns every tensor whose predecessors' sizes are multiples of 64 (all of a
transformer's BF16 weights); the reader copies whatever is still off a boundary.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file

ALIGN = 64  # bytes: a cache line, an AVX-512 vector
_PAD_KEY = "edgefire.align"  # metadata entry whose length sets the header's


def save_aligned(tensors: dict[str, torch.Tensor], path: Path,
                 metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, with the data section starting on an ALIGN-byte boundary.

    The header's length is only known once written, so a file that comes out unaligned is
    written once more with the padding entry grown to fit (a cold path: conversion, compress).
    """
    pad = ""
    for _ in range(2):
        save_file(tensors, path, metadata={**(metadata or {}), _PAD_KEY: pad})
        json_len = _json_length(path)
        if (8 + _round_up(json_len, 8)) % ALIGN == 0:
            return
        # safetensors pads the JSON with spaces to a multiple of 8: make it land on
        # 64k - 8 bytes by itself, so that no such padding is added.
        target = _round_up(json_len + 8, ALIGN) - 8
        pad += " " * (target - json_len)
    raise AssertionError(f"{path}: the header did not grow as its padding entry did")


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """tensor itself where it starts on an ALIGN-byte boundary, else an aligned copy."""
    return tensor if tensor.data_ptr() % ALIGN == 0 else tensor.clone()


def _json_length(path: Path) -> int:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = f.read(size)
    json.loads(header)  # a header that does not parse would make the arithmetic above wrong
    return len(header.rstrip(b" "))


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to
