"""Rotary position embedding: rotate-half (HF Llama) and interleaved pairs (Llama 4)."""

from __future__ import annotations

import math
from typing import Self

import torch


class _RotaryTable:
    """cos/sin per position, cast to the compute dtype once, gathered per step."""

    cos: torch.Tensor
    sin: torch.Tensor

    def to(self, dtype: torch.dtype) -> Self:
        self.cos, self.sin = self.cos.to(dtype), self.sin.to(dtype)
        return self

    def _at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables' rows for positions, broadcastable over [tokens, heads, dim]."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


class RotaryEmbedding(_RotaryTable):
    def __init__(self, head_dim: int, max_positions: int, base: float) -> None:
        inv_freq = rope_inv_freq(head_dim, base)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()
        self.half = head_dim // 2

    def __call__(self, positions: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
        """Rotate each [tokens, heads, head_dim] tensor by its token's position."""
        cos, sin = self._at(positions)
        out = []
        for x in xs:
            rotated = torch.cat((-x[..., self.half:], x[..., : self.half]), dim=-1)
            out.append(x * cos + rotated * sin)
        return out


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def llama3_scaled(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                  high_freq_factor: float, original_max_position: int) -> torch.Tensor:
    """Llama 3.1's long-context frequencies (also Llama 4 Scout's): long wavelengths slowed by
    `factor`, short ones kept, the band between blended; as HF's `llama3` rope type."""
    low_wavelen = original_max_position / low_freq_factor
    high_wavelen = original_max_position / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    # With low == high factor (Scout) the band is empty and smooth is inf/nan, never selected.
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor
                                                                   - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


class InterleavedRotaryEmbedding(_RotaryTable):
    """Rotary embedding on adjacent pairs (x[2i], x[2i+1]): Meta's Llama 4 layout (HF Llama4
    applies it as a complex product), and the layout llama.cpp's GGUF Q/K rows are in."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int) -> None:
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def __call__(self, positions: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
        """Rotate each [tokens, heads, head_dim] tensor by its token's position."""
        cos, sin = self._at(positions)
        out = []
        for x in xs:
            pairs = x.unflatten(-1, (-1, 2))
            even, odd = pairs[..., 0], pairs[..., 1]
            out.append(torch.stack((even * cos - odd * sin, even * sin + odd * cos),
                                   dim=-1).flatten(-2))
        return out
