"""Mixture-of-experts feed-forward as Llama 4 runs it: router -> top-k -> expert MLPs + shared.

Llama 4 scales each token by the sigmoid of its chosen expert's router logit *before* that
expert (the expert sees `score * x`), not after it as DeepSeek-style gating does; the shared
expert sees every token unscaled and the two outputs add. Scout routes each token to 1 of 16
experts. Tokens are grouped by expert so each expert runs one matmul over its own rows, which
is what bounds the cost to the active parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# x @ W^T for one projection, batch-invariant when the caller asks (row blocks).
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class SwiGLU:
    """One MLP: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]

    def __call__(self, x: torch.Tensor, linear: Linear) -> torch.Tensor:
        gate, up = linear(x, self.gate_up).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.down)


@dataclass(slots=True)
class MoEWeights:
    router: torch.Tensor  # [experts, hidden]
    gate_up: torch.Tensor  # [experts, 2 * intermediate, hidden]
    down: torch.Tensor  # [experts, hidden, intermediate]
    shared: SwiGLU

    @property
    def num_experts(self) -> int:
        return self.router.shape[0]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.router, self.gate_up, self.down, self.shared.gate_up, self.shared.down)


def route_sigmoid_top_k(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [tokens, k], scores [tokens, k]): the k largest logits, each through a
    sigmoid on its own (Llama 4; scores are not normalised across the k)."""
    top, ids = torch.topk(logits, top_k, dim=-1)
    return ids, torch.sigmoid(top.float()).to(logits.dtype)


def moe_forward(x: torch.Tensor, w: MoEWeights, top_k: int, linear: Linear) -> torch.Tensor:
    """shared(x) + sum over the chosen experts e of expert_e(score_e * x); x is [tokens, hidden]."""
    ids, scores = route_sigmoid_top_k(linear(x, w.router), top_k)
    routed_in = (x[:, None, :] * scores[..., None]).reshape(-1, x.shape[-1])
    routed = grouped_experts(routed_in, ids.reshape(-1), w, linear)
    return w.shared(x, linear) + routed.view(x.shape[0], top_k, -1).sum(dim=1)


def grouped_experts(x: torch.Tensor, ids: torch.Tensor, w: MoEWeights,
                    linear: Linear) -> torch.Tensor:
    """Row r of the result is expert ids[r]'s MLP applied to x[r]."""
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=w.num_experts).tolist()
    rows = x[order]
    pieces, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            piece = rows[start:start + count]
            gate, up = linear(piece, w.gate_up[expert]).chunk(2, dim=-1)
            pieces.append(linear(F.silu(gate) * up, w.down[expert]))
            start += count
    out = torch.empty_like(x)
    out[order] = torch.cat(pieces) if pieces else x[:0]
    return out
