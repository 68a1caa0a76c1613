"""Built-in weight codec that stores tensors as they are."""

from __future__ import annotations

import torch

from edgefire.runtime.plugins import hookimpl


class IdentityCodec:
    name = "identity"

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def decode(self, encoded: torch.Tensor) -> torch.Tensor:
        return encoded


@hookimpl
def edgefire_register_codecs(register):
    register("identity", IdentityCodec)
