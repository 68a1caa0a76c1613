"""The capacity planner: weights, KV cache and token capacity of a catalog model on a set of
accelerators, from the model's real config; which GPU sets (and so which cities) can host it;
and what a node on this machine needs to load it (the catalog's memory budgets).

Imports neither the gateway nor the node nor torch (an import-linter contract in
pyproject.toml), so both sides, the contract and `edgefire plan` may use it.
"""

from edgefire.planning.accelerators import ACCELERATORS, GB, GIB, Accelerator, GpuSet
from edgefire.planning.model import (
    PlannedModel,
    kv_bytes_per_token,
    local_kv_bytes_per_sequence,
    weight_bytes,
)
from edgefire.planning.node import CPU_NODE, node_need
from edgefire.planning.plan import MIN_HOST_TOKENS, Layout, Plan, plan
from edgefire.planning.report import describe, hosting

__all__ = [
    "ACCELERATORS", "CPU_NODE", "GB", "GIB", "MIN_HOST_TOKENS", "Accelerator", "GpuSet",
    "Layout", "Plan", "PlannedModel", "describe", "hosting", "kv_bytes_per_token",
    "local_kv_bytes_per_sequence", "node_need", "plan", "weight_bytes",
]
