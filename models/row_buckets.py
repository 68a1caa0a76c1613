"""Dense BF16 matmuls at a bounded set of row counts.

torch's BF16 matmul on CPU goes through oneDNN, which builds and caches kernels and their
buffers per input shape (about 0.85 MB each, measured). An engine whose steps carry any token
count from 8 to 1024 kept creating new ones: a 10-minute soak grew the node's RSS by 47%.
Padding the rows up to a bucket bounds the shapes to a few dozen, all met during warm-up; each
output row depends only on its own input row, so the real rows are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Below this, every row count is its own shape (small decode batches). Above, eight buckets
# per doubling: rows round up to a multiple of 1/8 of their power of two, so padding adds at
# most 12.5% and 32..1024 rows take 40 shapes.
EXACT_BELOW = 32


def bucket_rows(rows: int) -> int:
    if rows < EXACT_BELOW:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def dense_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T; BF16 inputs of 2 dims run at their bucket's row count."""
    # Decode steps (few rows) leave at the first test: this runs 120 times a step.
    rows = x.shape[0]
    if rows < EXACT_BELOW or x.dtype != torch.bfloat16 or x.dim() != 2:
        return F.linear(x, weight)
    padded = bucket_rows(rows)
    if padded == rows:
        return F.linear(x, weight)
    return F.linear(F.pad(x, (0, 0, 0, padded - rows)), weight)[:rows]


def blocked_linear(x: torch.Tensor, linear: Callable[[torch.Tensor], torch.Tensor],
                   block: int) -> torch.Tensor:
    """linear(x) run over blocks of exactly `block` rows (the last one zero-padded).

    A GEMM's result for a row depends on the call's row count (measured: float32 M=1 vs M=2..8
    vs M>=16 differ), not on the row's place in the call or on the other rows. With every call
    the same shape, a row's result is the same whatever rows share its step (deterministic mode).
    """
    rows = x.shape[0]
    if rows == 0:
        return linear(x)
    padded = -(-rows // block) * block
    x = F.pad(x, (0, 0, 0, padded - rows)) if padded != rows else x.contiguous()
    return torch.cat([linear(x[i:i + block]) for i in range(0, padded, block)])[:rows]
