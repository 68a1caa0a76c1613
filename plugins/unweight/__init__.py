"""Unweight-style lossless BF16 weight codec (exponent palette + Huffman, verbatim rows).

`unweight` stores each BF16 tensor in the distribution form and decodes it bit for bit.
`to_inference_form` / `decode_inference` are the load-time transcode and the cheap per-use
decode, for an engine that keeps weights compressed while resident.
"""

from __future__ import annotations

import torch

from edgefire.plugins.unweight.form import Distribution, Passthrough, decode_distribution, encode
from edgefire.plugins.unweight.inference import (
    Inference,
    decode_inference,
    inference_form,
    to_inference_form,
)
from edgefire.plugins.unweight.resident import UnweightLinear
from edgefire.plugins.unweight.serial import from_bytes, to_bytes
from edgefire.runtime.plugins import hookimpl

__all__ = ["Distribution", "Inference", "Passthrough", "UnweightCodec", "UnweightLinear", "decode",
           "decode_distribution", "decode_inference", "encode", "from_bytes", "inference_form",
           "to_bytes", "to_inference_form"]


def decode(encoded: Distribution | Inference | Passthrough | bytes) -> torch.Tensor:
    if isinstance(encoded, Passthrough):
        return encoded.tensor
    if isinstance(encoded, Inference):
        return decode_inference(encoded)
    if isinstance(encoded, (bytes, bytearray, memoryview)):
        encoded = from_bytes(encoded)
    return decode_distribution(encoded)


class UnweightCodec:
    """Lossless: the stored form decodes bit for bit. While resident, every 2-D weight the
    model multiplies by (embeddings included) stays in the 12-bit inference form."""

    name = "unweight"
    precision = "bfloat16-unweight"

    def encode(self, tensor: torch.Tensor) -> Distribution | Passthrough:
        return encode(tensor)

    def decode(self, encoded: Distribution | Inference | Passthrough | bytes) -> torch.Tensor:
        return decode(encoded)

    def to_resident(self, tensor: torch.Tensor) -> UnweightLinear:
        return UnweightLinear.from_weight(tensor)

    # Lossless, so the embedding table (and a tied lm_head) is held in the same form.
    to_resident_embedding = to_resident

    def to_bytes(self, encoded: Distribution | Passthrough) -> bytes | None:
        """The distribution form as bundle bytes; None for a tensor kept as it is."""
        return None if isinstance(encoded, Passthrough) else to_bytes(encoded)


@hookimpl
def edgefire_register_codecs(register):
    register("unweight", UnweightCodec)
