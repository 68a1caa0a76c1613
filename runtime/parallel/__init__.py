"""Parallel layouts: one model over several processes (tensor parallel), torch.distributed
(Gloo) between them. The strategies are plugins (plugins/tensor_parallel.py)."""

from edgefire.runtime.parallel.strategy import ParallelStrategy

__all__ = ["ParallelStrategy"]
