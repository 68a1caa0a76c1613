"""Weights kept in the inference form while resident, decoded just in time for each use.

A projection multiplies in one of two ways, chosen per weight shape and token count by the
autotuner (autotune.py): the native kernel decodes each output row inside a matrix-vector
product (reading 12 bits per weight instead of 16, which pays at decode batch sizes, where
the matmul is bound by memory), or the whole weight is decoded to BF16 and handed to torch's
matmul (which pays once enough tokens share the decode). Embedding lookups decode only the
rows they need.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edgefire.plugins.unweight import autotune
from edgefire.plugins.unweight.inference import (
    Inference,
    decode_inference,
    inference_form,
    row_verbatim_start,
)
from edgefire.plugins.unweight.native import resident_kernels


@dataclass(slots=True)
class UnweightLinear:
    form: Inference  # of a [N, K] weight, K a multiple of the row width
    verbatim_start: torch.Tensor  # int32 [N]
    fused_max_rows: int = 0  # up to this many rows, decode inside the matvec
    _decoder: object = None  # the row decoder's capsule, made once

    @classmethod
    def from_weight(cls, weight: torch.Tensor, tune: bool = True) -> UnweightLinear:
        """Encode `weight` (cast to BF16: exact for BF16 sources); tune picks fused_max_rows."""
        form = inference_form(weight.to(torch.bfloat16))
        resident = cls(form, row_verbatim_start(form))
        if tune and resident_kernels() is not None:
            resident.fused_max_rows = autotune.crossover(resident.shape, torch.bfloat16,
                                                         resident._measure_crossover)
        return resident

    def _measure_crossover(self) -> int:
        kernels = resident_kernels()
        return autotune.measure_crossover(lambda x: kernels.linear(x, *self._args()),
                                          self._decoded_linear, self.shape[1], torch.bfloat16)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.form.shape
        return n, k

    def _args(self) -> tuple[torch.Tensor, ...]:
        f = self.form
        return (f.packed, f.sign_mantissa, f.palette, f.verbatim_flags, self.verbatim_start,
                f.verbatim_values)

    def row_decoder(self) -> object:
        """This form's rows for the fused decode step (models/fused/row_decoder.h): a capsule
        of the native decoder, or None without native kernels."""
        kernels = resident_kernels()
        if kernels is None:
            return None
        if self._decoder is None:
            self._decoder = kernels.row_decoder(*self._args(), self.shape[1])
        return self._decoder

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.shape
        rows = x.reshape(-1, k)
        kernels = resident_kernels()
        if kernels is not None and rows.shape[0] <= self.fused_max_rows:
            out = kernels.linear(rows.contiguous(), *self._args())
        else:
            out = self._decoded_linear(rows)
        return out.view(*x.shape[:-1], n)

    def _decoded_linear(self, rows: torch.Tensor) -> torch.Tensor:
        n, k = self.shape
        kernels = resident_kernels()
        if kernels is None:
            return F.linear(rows, self.decode().to(rows.dtype))
        # Decoding into a reused buffer spares a fresh allocation's page faults every call.
        weight = _scratch(n * k)[:n * k].view(n, k)
        kernels.decode_rows(_ALL_ROWS, *self._args(), k, weight)
        return F.linear(rows, weight.view(torch.bfloat16).to(rows.dtype))

    def decode(self) -> torch.Tensor:
        """The whole BF16 weight."""
        return self.rows(_ALL_ROWS)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows `ids` of the weight (all of them when ids is empty), as an embedding lookup."""
        n, k = self.shape
        kernels = resident_kernels()
        if kernels is None:
            dense = decode_inference(self.form)
            return (dense if ids.numel() == 0 else dense[ids]).to(dtype)
        flat = ids.reshape(-1).long().contiguous()
        out = torch.empty(flat.numel() or n, k, dtype=torch.int16)
        kernels.decode_rows(flat, *self._args(), k, out)
        out = out.view(torch.bfloat16).to(dtype)
        return out if ids.numel() == 0 else out.view(*ids.shape, k)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.form.tensors(), self.verbatim_start)


_ALL_ROWS = torch.empty(0, dtype=torch.long)
_local = threading.local()


def _scratch(numel: int) -> torch.Tensor:
    """This thread's decode buffer, grown to the largest weight decoded so far."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.numel() < numel:
        buffer = _local.buffer = torch.empty(numel, dtype=torch.int16)
    return buffer
