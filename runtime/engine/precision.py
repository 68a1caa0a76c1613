"""Per-step choice of compute dtype.

On CPU, float32 matrix-vector products (few tokens per step) beat bfloat16, while bfloat16
matrix-matrix products win once a step carries enough tokens (see README, "Precision").
"auto" keeps the weights in both dtypes and picks by the step's token count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.errors import InvalidInputError

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
            return cls(torch.float32, torch.bfloat16, min_large_tokens, torch.bfloat16)
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
