"""Interleaved partial RoPE on the trailing ``rope_dim`` channels of each head.

Two tables exist per model: ``main`` (sliding-only layers) and ``compress`` (CSA / HCA
layers, their compressors and the indexer), optionally YaRN-scaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import RopeConfig


def inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    """[dim/2] fp32 inverse frequencies (YaRN blends interpolation and extrapolation)."""
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if rope.rope_type == "default":
        return 1.0 / pos_freqs

    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(rope.theta))
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (rope.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


@dataclass(frozen=True, slots=True)
class RopeTable:
    """cos / sin for a set of positions: [T, rope_dim/2] fp32 each."""

    cos: torch.Tensor
    sin: torch.Tensor

    @staticmethod
    def at(freqs: torch.Tensor, positions: torch.Tensor) -> RopeTable:
        angles = positions.to(torch.float32)[:, None] * freqs[None, :]
        return RopeTable(angles.cos(), angles.sin())

    def select(self, rows: slice) -> RopeTable:
        return RopeTable(self.cos[rows], self.sin[rows])


def apply_rope(x: torch.Tensor, table: RopeTable, inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing rope channels of ``x [T, ..., D]``; pairs are (2i, 2i+1).

    ``inverse`` rotates by ``-angle`` (used to undo RoPE on the attention output).
    """
    half = table.cos.shape[-1]
    extra = x.dim() - 2  # broadcast over head axes between T and D
    rotation = torch.complex(table.cos, -table.sin if inverse else table.sin)
    rotation = rotation.view(rotation.shape[0], *([1] * extra), half)
    pairs = torch.view_as_complex(x[..., -2 * half :].float().reshape(*x.shape[:-1], half, 2))
    rotated = torch.view_as_real(pairs * rotation).flatten(-2)
    return torch.cat((x[..., : -2 * half], rotated.to(x.dtype)), dim=-1)
