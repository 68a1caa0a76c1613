"""Read a GGUF file: metadata fields and tensors dequantized into a torch dtype."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch


@dataclass(slots=True)
class GGUFWeights:
    """An opened GGUF file; tensors are dequantized lazily, one at a time, on iteration."""

    path: Path
    reader: gguf.GGUFReader

    def field(self, key: str, default: object = None) -> object:
        entry = self.reader.fields.get(key)
        return default if entry is None else entry.contents()

    def tensors(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) with GGUF names, shaped (out, in) like torch weights."""
        for tensor in self.reader.tensors:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            # F32 tensors come back as read-only views of the memory-mapped file: copy them.
            yield tensor.name, torch.tensor(np.asarray(array, dtype=np.float32), dtype=dtype)


def read_gguf(path: str | Path) -> GGUFWeights:
    return GGUFWeights(Path(path), gguf.GGUFReader(str(path)))
