"""Per-step choice of compute dtype.

Which dtype is faster on CPU depends on the step's token count and on the CPU: with native
bfloat16 dot products (AVX512_BF16, AMX) bfloat16 wins at every batch size; without them,
float32 matrix-vector products beat emulated bfloat16 while bfloat16 matrix-matrix products
still win once a step carries enough tokens (README, "Precision", has the measurements).
"auto" picks per CPU, and per step by token count where the two differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from edgefire.contract.errors import InvalidInputError

_NAMED = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(slots=True, frozen=True)
class Precision:
    small: torch.dtype  # steps with fewer than min_large_tokens tokens
    large: torch.dtype
    min_large_tokens: int
    kv: torch.dtype

    @classmethod
    def parse(cls, name: str, min_large_tokens: int = 8) -> Precision:
        if name == "auto":
            small = torch.bfloat16 if _native_bfloat16() else torch.float32
            return cls(small, torch.bfloat16, min_large_tokens, torch.bfloat16)
        if name not in _NAMED:
            raise InvalidInputError(f"dtype must be one of auto, {', '.join(_NAMED)}",
                                    field="dtype")
        dtype = _NAMED[name]
        return cls(dtype, dtype, 0, dtype)

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return (self.small,) if self.small == self.large else (self.small, self.large)

    def for_step(self, num_tokens: int) -> torch.dtype:
        return self.large if num_tokens >= self.min_large_tokens else self.small


@functools.cache
def _native_bfloat16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))
