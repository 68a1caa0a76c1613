"""Weight-only quantization codecs: `int8` (per output channel) and `int4` (group-wise).

A catalog entry opts in with `codec: int8`, `codec: int4` (groups of 32) or `codec: int4-g64`
/ `int4-g128`. The INT4 default is 32 because SmolLM2's GGUF is Q4_1, itself 4-bit in groups
of 32: groups of 32 line up with it and lose almost nothing, while groups of 64 re-round it
onto a coarser grid and cost ~45% perplexity (bench/results/quant.md).

These codecs leave the stored form alone (encode and decode pass tensors
through, so the warm cache holds the dense weights under the codec's own key); what they change
is the resident form. Beyond the WeightCodec contract they offer:

- `precision`: the name the loaded model reports as `weight_precision` ("int8", "int4-g32");
- `to_resident(tensor)`: a projection weight's packed form, whose `linear(x)` the model calls
  instead of `F.linear(x, W)` (see edgefire.models.llama.ResidentLinear).

- `to_resident_embedding(tensor)`: the embedding table's (and a tied lm_head's) form, INT8 per
  row under both codecs, as llama.cpp's Q4_1 GGUF of SmolLM2 keeps its token_embd in Q8_0.

The loader applies them with `model.make_resident(codec.to_resident, codec.precision,
codec.to_resident_embedding)`. The layers' qkv/o/gate_up/down projections take the codec's
bits; the embedding table takes INT8, because at one token the tied lm_head is the largest
single read of a step (49152 x 576: 56 MB in BF16, a third of an INT8 step's bytes and almost
half of an INT4 one's) and 8 bits per row lose little there (bench/results/quant.md). The
norms stay in the compute dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from edgefire.plugins.quant.linear import Int4Linear, Int8Linear
from edgefire.runtime.plugins import hookimpl


@dataclass(slots=True)
class QuantCodec:
    name: str
    bits: int  # 8 or 4
    group_size: int = 32  # INT4 only

    @property
    def precision(self) -> str:
        return "int8" if self.bits == 8 else f"int4-g{self.group_size}"

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def decode(self, encoded: torch.Tensor) -> torch.Tensor:
        return encoded

    def to_resident(self, tensor: torch.Tensor) -> Int8Linear | Int4Linear:
        if self.bits == 8:
            return Int8Linear.quantize(tensor)
        return Int4Linear.quantize(tensor, self.group_size)

    def to_resident_embedding(self, tensor: torch.Tensor) -> Int8Linear:
        return Int8Linear.quantize(tensor)


CODECS = {
    "int8": functools.partial(QuantCodec, "int8", 8),
    "int4": functools.partial(QuantCodec, "int4", 4, 32),
    **{f"int4-g{g}": functools.partial(QuantCodec, f"int4-g{g}", 4, g) for g in (32, 64, 128)},
}


@hookimpl
def edgefire_register_codecs(register):
    for name, factory in CODECS.items():
        register(name, factory)
