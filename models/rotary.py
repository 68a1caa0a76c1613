"""Rotary position embedding (rotate-half form, as HF Llama applies it)."""

from __future__ import annotations

import torch


class RotaryEmbedding:
    def __init__(self, head_dim: int, max_positions: int, base: float) -> None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (base**exponents)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()
        self.half = head_dim // 2

    def to(self, dtype: torch.dtype) -> RotaryEmbedding:
        self.cos, self.sin = self.cos.to(dtype), self.sin.to(dtype)
        return self

    def __call__(self, positions: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
        """Rotate each [tokens, heads, head_dim] tensor by its token's position."""
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        out = []
        for x in xs:
            rotated = torch.cat((-x[..., self.half:], x[..., : self.half]), dim=-1)
            out.append(x * cos + rotated * sin)
        return out
