"""Expert parallelism for the MoE architectures (DeepSeek-V3/Kimi K2.5, Llama 4).

Each rank holds a contiguous run of every MoE layer's routed experts; the routers, the shared
experts, attention and the dense layers are replicated, so every rank has the whole batch's
hidden states before and after each MoE block. In a block, each rank takes its slice of the
tokens, routes them, and sends every (token, expert) pair to the rank holding that expert
(an all-to-all); the ranks run the pairs they receive through their experts and send the
outputs back (a second all-to-all), where each is weighted into its token's sum in the same
expert order as on one process; with the shared expert added, an all-gather of the slices
gives every rank the block's whole output.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from edgefire.models.moe import Experts, Linear, MoE, Routing
from edgefire.models.tensor_parallel import split


class ExpertComm(Protocol):
    """The collectives expert dispatch needs (runtime/parallel/collectives.py)."""

    rank: int
    world_size: int

    def all_to_all(self, rows: torch.Tensor, send_counts: list[int],
                   recv_counts: list[int]) -> torch.Tensor:
        """rows [sum(send_counts), ...] sent in runs to ranks 0, 1, …; the runs received."""
        ...

    def exchange_counts(self, counts: list[int]) -> list[int]:
        """counts[r]: rows this rank sends rank r; returns the rows each rank sends it."""
        ...

    def all_gather_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Every rank's rows (rank r has counts[r]) stacked in rank order, on every rank."""
        ...


@dataclass(slots=True)
class ExpertDispatch:
    comm: ExpertComm
    owned: list[range]  # every rank's experts (ids), in rank order

    def __call__(self, moe: MoE, x: torch.Tensor, routing: Routing,
                 linear: Linear) -> torch.Tensor:
        comm, world = self.comm, self.comm.world_size
        slices = [split(x.shape[0], world, r) for r in range(world)]
        mine = slices[comm.rank]
        top_k = routing.experts.shape[1]
        experts = routing.experts[mine.start:mine.stop].reshape(-1)
        weights = routing.weights[mine.start:mine.stop].reshape(-1)
        # The slice's pairs in expert order, so each rank's run is contiguous and each
        # token's outputs are summed in the order one process sums them.
        order = experts.argsort(stable=True)
        experts, weights = experts[order], weights[order]
        tokens = order // top_k  # within the slice
        owner = torch.bucketize(experts, torch.tensor([r.stop for r in self.owned[:-1]]),
                                right=True)
        send = torch.bincount(owner, minlength=world).tolist()
        recv = comm.exchange_counts(send)
        rows = comm.all_to_all(x[mine.start:mine.stop][tokens], send, recv)
        # Each pair's expert id (exact in float32) and its routing weight travel together.
        meta = comm.all_to_all(torch.stack([experts.float(), weights], dim=1), send, recv)
        local = meta[:, 0].long() - self.owned[comm.rank].start
        done = moe.experts(rows, Routing(meta[:, 1:], local[:, None]), moe.scale_inputs, linear)
        back = comm.all_to_all(done, recv, send)
        out = torch.zeros(len(mine), x.shape[1], dtype=x.dtype)
        out.index_add_(0, tokens, back)
        if moe.shared is not None:
            out = out + moe.shared(x[mine.start:mine.stop], linear)
        return comm.all_gather_rows(out, [len(s) for s in slices])


def shard_experts(model: Any, rank: int, comm: ExpertComm) -> Any:
    """model (a DeepSeek-V3 or Llama 4 model, changed in place) keeping only rank's routed
    experts of each MoE block, which then dispatch through comm. Raises ValueError where the
    model has no MoE block or fewer experts than ranks."""
    # each block once: a block may be shared by the model's copies in several dtypes
    blocks = list({id(moe): moe for params in model.params.values() for layer in params.layers
                   for moe in _moe_blocks(layer)}.values())
    if not blocks:
        raise ValueError("expert parallelism needs a model with MoE blocks")
    world = comm.world_size
    for moe in blocks:
        num = moe.experts.gate_up.shape[0]
        if num < world:
            raise ValueError(f"{num} experts cannot be split over {world} ranks")
        owned = [split(num, world, r) for r in range(world)]
        mine = owned[rank]
        moe.experts = Experts(moe.experts.gate_up[mine.start:mine.stop].clone(),
                              moe.experts.down[mine.start:mine.stop].clone())
        moe.dispatch = ExpertDispatch(comm, owned)
    return model


def _moe_blocks(layer: object) -> list[MoE]:
    return [value for f in fields(layer) if isinstance(value := getattr(layer, f.name), MoE)]
