"""Which cores each rank of a parallel layout computes on."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class RankThreads:
    cores: tuple[tuple[int, ...], ...]  # per rank: the cores its torch threads use
    pin: bool  # each rank bound to its cores (os.sched_setaffinity)

    @classmethod
    def plan(cls, world_size: int, pin: bool) -> RankThreads:
        """This process's cores split evenly over the ranks (a rank per core on a machine with
        fewer cores than ranks)."""
        cores = sorted(os.sched_getaffinity(0))
        per = max(1, len(cores) // world_size)
        return cls(tuple(tuple(cores[(r * per + i) % len(cores)] for i in range(per))
                         for r in range(world_size)), pin)

    def apply(self, rank: int) -> None:
        """In rank's process: its thread count and, pinned, its cores."""
        torch.set_num_threads(len(self.cores[rank]))
        if self.pin:
            os.sched_setaffinity(0, self.cores[rank])
