"""Native fused decode steps: a whole decode step's layers in one call (llama_decode.cpp)."""

from edgefire.models.fused.llama_decode import (
    MAX_ROWS,
    MAX_ROWS_BESIDE_AMX,
    FusedLlamaDecode,
    fused_kernels,
    weight_form,
)

__all__ = ["MAX_ROWS", "MAX_ROWS_BESIDE_AMX", "FusedLlamaDecode", "fused_kernels", "weight_form"]
