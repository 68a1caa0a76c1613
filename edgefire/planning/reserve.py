"""What a device keeps besides weights and KV: the runtime, one step's activations and the
sampled logits. Stated once here; tables and tests read these, never copies of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgefire.planning.shapes import Layer, ModelShape

MIB = 1 << 20


@dataclass(slots=True, frozen=True)
class Reserve:
    runtime_bytes: int  # per device: context, library workspaces, allocator slack
    step_tokens: int  # tokens one step carries (a prefill chunk plus decodes)
    max_seqs: int  # sequences sampled in one step
    act_bytes: int = 2  # activations in the compute dtype
    logit_bytes: int = 4  # logits are sampled in float32

    def device_bytes(self, shape: ModelShape, layers: Sequence[Layer], tp: int,
                     last: bool) -> int:
        """One device's reserve: runtime, plus the widest layer's activations for a full step
        (the residual stream and its normed copy are whole on every rank, the rest is
        sharded), plus, on the last stage, one vocabulary-sharded row of logits per sequence.
        Attention is taken to be computed blockwise (flash-style): no score matrix."""
        width = max((layer.act_width for layer in layers), default=0)
        activations = self.step_tokens * (2 * shape.hidden_size + width / tp) * self.act_bytes
        logits = self.max_seqs * shape.vocab_size / tp * self.logit_bytes
        return round(self.runtime_bytes + activations + (logits if last and not shape.encoder
                                                         else 0))


# An Infire-like engine on a GPU: 1 GiB per device for the CUDA context (~0.5 GiB), cuBLAS and
# NCCL workspaces and CUDA-graph pools (Infire has no framework allocator cache to reserve
# for); a step of 8192 tokens in bfloat16; up to 256 sequences sampled per step.
GPU_RESERVE = Reserve(runtime_bytes=1 << 30, step_tokens=8192, max_seqs=256)
