"""Mixture of experts: router scores -> top-k experts per token -> their SwiGLU MLPs (+ shared).

Shared by the MoE architectures (DeepSeek-V3/Kimi K2.5, and Llama 4, whose experts take the
score-scaled token: `scale_inputs`). Three separate steps, so an architecture can swap the
routing rule without touching the expert dispatch:

    routing = route(router_logits, RouterSpec(...), bias)      # which experts, what weight
    out = experts(x, routing)                                   # each expert on its tokens
    out = out + shared(x)                                       # the always-on shared expert
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

# x @ W^T. A model passes its own (models/row_buckets.py: bucketed rows, or fixed row blocks in
# deterministic mode) to run every projection the way its other layers run theirs.
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True, frozen=True)
class RouterSpec:
    """How a router turns its logits into expert choices (DeepSeek-V3's config names)."""

    top_k: int
    scoring: str = "sigmoid"  # "sigmoid" (DeepSeek-V3, Kimi K2) or "softmax" (DeepSeek-V2)
    # Group-limited routing: experts are split into n_group groups and each token picks its
    # experts only from its topk_group best groups (DeepSeek-V3: 8 and 4; Kimi K2: 1 and 1,
    # which leaves every expert eligible).
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True  # renormalize the chosen weights to sum to 1
    scaling: float = 1.0  # routed_scaling_factor, applied after renormalization


@dataclass(slots=True)
class Routing:
    """Per token, the experts it goes to and the weight of each one's output."""

    weights: torch.Tensor  # [tokens, top_k] float32
    experts: torch.Tensor  # [tokens, top_k] int64


def route(logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None) -> Routing:
    """Top-k routing of [tokens, experts] float32 router logits.

    DeepSeek-V3's "noaux_tc" rule: the correction bias (learned for load balance) takes part in
    *choosing* the experts only; the weights are the unbiased scores of the chosen ones.
    """
    scores = logits.sigmoid() if spec.scoring == "sigmoid" else logits.softmax(dim=-1)
    choice = scores if bias is None else scores + bias
    if spec.n_group > 1:
        tokens, num_experts = choice.shape
        grouped = choice.view(tokens, spec.n_group, num_experts // spec.n_group)
        # A group's merit: the sum of its best two (biased) scores for sigmoid routing, as
        # DeepSeek-V3 does; its best score for softmax routing (DeepSeek-V2's group-limited
        # greedy).
        merit = (grouped.topk(2, dim=-1).values.sum(dim=-1) if spec.scoring == "sigmoid"
                 else grouped.amax(dim=-1))
        best = merit.topk(spec.topk_group, dim=-1).indices
        keep = torch.zeros_like(merit, dtype=torch.bool).scatter_(1, best, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, num_experts)
    chosen = choice.topk(spec.top_k, dim=-1).indices
    weights = scores.gather(1, chosen)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return Routing(weights * spec.scaling, chosen)


@dataclass(slots=True)
class SwiGLU:
    """down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]

    def __call__(self, x: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        gate, up = linear(x, self.gate_up).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.down)


@dataclass(slots=True)
class Experts:
    """Every routed expert's SwiGLU weights stacked, as HF transformers 5 stores them."""

    gate_up: torch.Tensor  # [experts, 2 * intermediate, hidden]
    down: torch.Tensor  # [experts, hidden, intermediate]

    def __call__(self, x: torch.Tensor, routing: Routing, scale_inputs: bool = False,
                 linear: Linear = F.linear) -> torch.Tensor:
        """Sum over each token's experts of weight * expert(x); with scale_inputs (Llama 4),
        expert(weight * x) instead. x: [tokens, hidden] -> [tokens, hidden]."""
        top_k = routing.experts.shape[1]
        flat = routing.experts.reshape(-1)
        # Sorting the (token, slot) pairs by expert gives each expert one contiguous run of
        # its tokens: one matmul per expert that has any, whatever the batch.
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.gate_up.shape[0]).tolist()
        tokens = order // top_k
        weights = routing.weights.reshape(-1)[order].to(x.dtype)[:, None]
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = slice(start, start + count)
            start += count
            idx = tokens[rows]
            h = x[idx] * weights[rows] if scale_inputs else x[idx]
            gate, up = linear(h, self.gate_up[expert]).chunk(2, dim=-1)
            y = linear(F.silu(gate) * up, self.down[expert])
            out.index_add_(0, idx, y if scale_inputs else y * weights[rows])
        return out


class Dispatch(Protocol):
    """Runs a MoE block's routed experts where they live (models/expert_parallel.py): this
    rank holds some of them, the other ranks the rest."""

    def __call__(self, moe: MoE, x: torch.Tensor, routing: Routing,
                 linear: Linear) -> torch.Tensor: ...


@dataclass(slots=True)
class MoE:
    """A routed-experts block with an optional always-on shared expert (DeepSeek-V3 layout).

    The router runs in float32 whatever the compute dtype, as the released checkpoints keep
    it (a bfloat16 router flips near-tied expert choices)."""

    router: torch.Tensor  # [experts, hidden] float32
    bias: torch.Tensor | None  # [experts] float32 e_score_correction_bias, or None
    experts: Experts
    shared: SwiGLU | None
    spec: RouterSpec
    scale_inputs: bool = False  # Llama 4: each expert sees score * x, its output unweighted
    # Expert parallel: `experts` holds this rank's experts only, dispatch reaches the rest.
    dispatch: Dispatch | None = None

    def __call__(self, x: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        routing = route(linear(x.float(), self.router), self.spec, self.bias)
        if self.dispatch is not None:
            return self.dispatch(self, x, routing, linear)
        out = self.experts(x, routing, self.scale_inputs, linear)
        return out if self.shared is None else out + self.shared(x, linear)

    def tensors(self) -> list[torch.Tensor]:
        held = [self.router, self.experts.gate_up, self.experts.down]
        held += [] if self.bias is None else [self.bias]
        return held + ([] if self.shared is None else [self.shared.gate_up, self.shared.down])
