"""The collectives a parallel layout's ranks run, over torch.distributed's Gloo backend.

One process group per loaded model, built from its own TCPStore rather than torch's default
group, so a node can hold several parallel models and rebuild one without the others. Every
collective has the group's timeout: a rank that died fails the others' next collective at
once (the connection resets), a rank that hangs fails it when the timeout passes; both raise
ModelLostError, never hang a step.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from edgefire.runtime.engine.llm_engine import ModelLostError

ROOT = 0  # the rank in the node's own process: it runs the scheduler and samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collectives:
    def __init__(self, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        timeout = timedelta(seconds=timeout_s)
        self.rank = rank
        self.world_size = world_size
        # Time this rank spent in collectives, and how many: what bench/parallel.py reports.
        self.seconds = 0.0
        self.calls = 0
        try:
            self._store = dist.TCPStore("127.0.0.1", port, world_size, rank == ROOT,
                                        timeout=timeout)
            self._group = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)
        except (RuntimeError, dist.DistStoreError) as exc:
            raise ModelLostError(f"rank {rank}: the ranks did not meet ({exc})") from exc

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
            self.seconds += time.perf_counter() - started
            self.calls += 1
