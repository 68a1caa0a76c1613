"""Weights files put the data on a 64-byte boundary whatever their header's length, and a
tensor read off one is used where it lies when aligned, copied when not."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from edgefire.runtime.weights.aligned import ALIGN, aligned, save_aligned


def _data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


@pytest.mark.parametrize("metadata_length", range(0, 72, 7))  # every residue of the header
def test_data_starts_on_a_boundary_and_reads_back(tmp_path: Path, metadata_length: int):
    tensors = {"w": torch.randn(64, 32).to(torch.bfloat16), "n": torch.ones(32)}
    path = tmp_path / "w.safetensors"
    save_aligned(tensors, path, {"note": "x" * metadata_length})
    assert _data_start(path) % ALIGN == 0
    loaded = load_file(path)
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    assert all(t.data_ptr() % ALIGN == 0 for t in loaded.values())  # mapped at a page


def test_a_tensor_off_a_boundary_is_copied_and_an_aligned_one_is_not():
    buffer = torch.zeros(1024, dtype=torch.uint8)
    assert aligned(buffer) is buffer
    shifted = buffer[16:].view(torch.bfloat16)
    assert shifted.data_ptr() % ALIGN
    copy = aligned(shifted)
    assert copy.data_ptr() % ALIGN == 0 and torch.equal(copy, shifted)
