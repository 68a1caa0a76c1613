"""The weight codec contract: how a tensor is stored (in a bundle, in memory) and restored."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch


class WeightCodec(Protocol):
    name: str

    def encode(self, tensor: torch.Tensor) -> Any:
        """The stored form of `tensor` (any picklable object)."""
        ...

    def decode(self, encoded: Any) -> torch.Tensor:
        """The tensor back; a lossless codec returns it bit for bit."""
        ...


def through_codec(tensors: Iterable[tuple[str, torch.Tensor]],
                  codec: WeightCodec) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass each weight through the codec's stored form, as loading from a bundle does."""
    for name, tensor in tensors:
        yield name, codec.decode(codec.encode(tensor))
