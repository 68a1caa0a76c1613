"""The collectives a parallel layout's ranks run, over torch.distributed's Gloo backend.

One process group per loaded model, built from its own TCPStore rather than torch's default
group, so a node can hold several parallel models and rebuild one without the others; a
layout that combines axes adds subgroups over the same store (a pipeline stage's tensor-
parallel ranks meet in their own all-reduces, as torch's new_group would do it). Every
collective has the group's timeout: a rank that died fails the others' next collective at
once (the connection resets), a rank that hangs fails it when the timeout passes; both raise
ModelLostError, never hang a step.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from edgefire.runtime.engine.llm_engine import ModelLostError

ROOT = 0  # the rank in the node's own process: it runs the scheduler and samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Tally:
    """Time a rank spent in collectives, and how many, over all its groups: what
    bench/parallel.py reports."""

    seconds: float = 0.0
    calls: int = 0


class Collectives:
    def __init__(self, store: dist.Store, group: dist.ProcessGroup, rank: int,
                 world_size: int, timeout: timedelta, tally: Tally) -> None:
        """Use connect() or subgroup(): this wraps a group they built."""
        self.rank = rank
        self.world_size = world_size
        self.tally = tally
        self._store = store
        self._group = group
        self._timeout = timeout
        self._subgroups: dict[range, Collectives] = {}

    @classmethod
    def connect(cls, port: int, rank: int, world_size: int, timeout_s: float) -> Collectives:
        """Rank's collectives among world_size ranks meeting at port (ROOT serves the store);
        returns once every rank has joined."""
        timeout = timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore("127.0.0.1", port, world_size, rank == ROOT, timeout=timeout)
            group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        except (RuntimeError, dist.DistStoreError) as exc:
            raise ModelLostError(f"rank {rank}: the ranks did not meet ({exc})") from exc
        return cls(store, group, rank, world_size, timeout, Tally())

    def subgroup(self, ranks: range) -> Collectives:
        """The collectives among `ranks` alone, which this rank is one of, numbered from 0 in
        their order. Every rank of them must ask for it (it returns once they all have); it
        is built once and kept."""
        assert self.rank in ranks, (self.rank, ranks)
        if len(ranks) == self.world_size:
            return self
        if ranks not in self._subgroups:
            store = dist.PrefixStore(f"ranks{ranks.start}-{ranks.stop}", self._store)
            try:
                group = dist.ProcessGroupGloo(store, self.rank - ranks.start, len(ranks),
                                              self._timeout)
            except (RuntimeError, dist.DistStoreError) as exc:
                raise ModelLostError(f"rank {self.rank}: ranks {ranks.start}-{ranks.stop - 1} "
                                     f"did not meet ({exc})") from exc
            self._subgroups[ranks] = Collectives(store, group, self.rank - ranks.start,
                                                 len(ranks), self._timeout, self.tally)
        return self._subgroups[ranks]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """tensor summed over the ranks, in place (float32 sums for a BF16 tensor)."""
        if tensor.dtype == torch.bfloat16:
            # Gloo sums in the tensor's dtype: partials meet in float32, rounded once.
            wide = tensor.float()
            self._run(lambda: self._group.allreduce([wide]), "all-reduce")
            return tensor.copy_(wide)
        self._run(lambda: self._group.allreduce([tensor]), "all-reduce")
        return tensor

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's tensor (same shape and dtype), on ROOT; None elsewhere."""
        tensor = tensor.contiguous()
        out = ([[torch.empty_like(tensor) for _ in range(self.world_size)]]
               if self.rank == ROOT else [])
        opts = dist.GatherOptions()
        opts.rootRank = ROOT
        self._run(lambda: self._group.gather(out, [tensor], opts), "gather")
        return out[0] if out else None

    def gather_columns(self, part: torch.Tensor, widths: list[int]) -> torch.Tensor | None:
        """On ROOT, the ranks' [rows, widths[r]] parts side by side; None elsewhere. Each part
        travels padded to the widest (Gloo gathers tensors of one shape)."""
        padded = torch.nn.functional.pad(part, (0, max(widths) - part.shape[1]))
        parts = self.gather(padded)
        if parts is None:
            return None
        return torch.cat([p[:, :w] for p, w in zip(parts, widths, strict=True)], dim=1)

    def all_to_all(self, rows: torch.Tensor, send_counts: list[int],
                   recv_counts: list[int]) -> torch.Tensor:
        """rows [sum(send_counts), ...] sent in runs to ranks 0, 1, …; the runs received."""
        out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
        self._run(lambda: self._group.alltoall_base(out, rows.contiguous(), recv_counts,
                                                    send_counts, dist.AllToAllOptions()),
                  "all-to-all")
        return out

    def exchange_counts(self, counts: list[int]) -> list[int]:
        """counts[r]: rows this rank sends rank r; returns the rows each rank sends it."""
        ones = [1] * self.world_size
        return self.all_to_all(torch.tensor(counts), ones, ones).tolist()

    def all_gather_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Every rank's rows (rank r has counts[r]) stacked in rank order, on every rank;
        each travels padded to the most (Gloo gathers tensors of one shape)."""
        most = max(counts)
        padded = torch.nn.functional.pad(rows, (0, 0, 0, most - rows.shape[0]))
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        self._run(lambda: self._group.allgather([parts], [padded]), "all-gather")
        return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)])

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        """Start sending tensor to rank dst; finish() it (the tensor must live till then)."""
        return self._group.send([tensor], dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        """tensor filled with what rank src sends with tag."""
        self._run(lambda: self._group.recv([tensor], src, tag), "receive")
        return tensor

    def finish(self, sends: list[dist.Work]) -> None:
        """Wait for sends started by send()."""
        for work in sends:
            self._run(lambda work=work: work, "send")

    def _run(self, launch: Callable[[], dist.Work], what: str) -> None:
        started = time.perf_counter()
        try:
            launch().wait()
        except RuntimeError as exc:  # Gloo reports a lost peer or a timeout as RuntimeError
            raise ModelLostError(f"rank {self.rank}: {what} failed ({exc})") from exc
        finally:
            self.tally.seconds += time.perf_counter() - started
            self.tally.calls += 1
