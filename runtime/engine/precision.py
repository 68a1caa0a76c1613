"""Per-step choice of compute dtype.

Which dtype is faster on CPU depends on the step's token count and on the CPU (README,
"Precision", has the measurements). "auto" picks per CPU, and per step by token count where
the two differ:
- native bfloat16 dot products (AVX512_BF16, AMX): bfloat16 at every batch size;
- without them (AVX-512 alone, e.g. Ice Lake, or AVX2 alone): torch's bfloat16 GEMM there is
  a slow fallback (Ice Lake, 2 cores: 57 against float32's 186 GFLOP/s at 64 rows, 64 against
  281 at a 385-token prompt; AVX2: 7x float32 at 64 rows, 100x+ on a prefill's [1024, 1024]),
  while a decode step of up to FUSED_BFLOAT16_MAX_TOKENS decodes runs in models/fused, which
  reads bfloat16 weights (half float32's bytes) widened in registers: bfloat16 for such steps
  (and for the prompt chunks that step takes: ModelRunner.small_prompts), float32 for the rest;
- neither (no vector units the kernels use): float32 below `min_large_tokens` and bfloat16
  above, as once measured on AVX-512 without bfloat16, before models/fused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgefire.contract.cpu import cpu_class
from edgefire.contract.errors import InvalidInputError

_NAMED = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# models/fused's rows without native bfloat16: the largest decode step its bfloat16 path takes
# there (it beats torch's float32 at every decode size: llama_decode.py has the measurements).
FUSED_BFLOAT16_MAX_TOKENS = 64


@dataclass(slots=True, frozen=True)
class Precision:
    small: torch.dtype  # steps with fewer than min_large_tokens tokens
    large: torch.dtype
    min_large_tokens: int
    kv: torch.dtype
    # `small` only for steps of decodes alone (without native bfloat16: only those surely
    # reach models/fused, and a prompt chunk in bfloat16 would meet torch's slow bfloat16 GEMM).
    small_decodes_only: bool = False

    @classmethod
    def parse(cls, name: str, min_large_tokens: int = 8) -> Precision:
        if name == "auto":
            bf16, fp32 = torch.bfloat16, torch.float32
            cpu = _cpu_class()
            if cpu == "native_bfloat16":
                return cls(bf16, bf16, 0, bf16)
            if cpu in ("avx512", "avx2"):
                return cls(bf16, fp32, FUSED_BFLOAT16_MAX_TOKENS + 1, bf16, True)
            return cls(fp32, bf16, min_large_tokens, bf16)
        if name not in _NAMED:
            raise InvalidInputError(f"dtype must be one of auto, {', '.join(_NAMED)}",
                                    field="dtype")
        dtype = _NAMED[name]
        return cls(dtype, dtype, 0, dtype)

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return (self.small,) if self.small == self.large else (self.small, self.large)

    def for_step(self, num_tokens: int, decodes_only: bool = False) -> torch.dtype:
        """The dtype of a step of num_tokens tokens (decodes_only: every one a sequence's next
        token or a draft being verified, no prompt chunk)."""
        if num_tokens >= self.min_large_tokens or (self.small_decodes_only and not decodes_only):
            return self.large
        return self.small


def _cpu_class() -> str:
    return cpu_class()
