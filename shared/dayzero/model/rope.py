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


def cos_sin(freqs: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles of ``positions`` [T]: [T, rope_dim/2] fp32 each."""
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    return angles.cos(), angles.sin()


@dataclass(frozen=True, slots=True)
class RopeTable:
    """A step's rotations: ``rotation`` = cos + i sin and ``inverse`` = cos - i sin
    [T, rope_dim/2] complex64, built once with the table (a step's tables serve every layer;
    multiplying by a lazy ``conj()`` resolves it on every call)."""

    rotation: torch.Tensor
    inverse: torch.Tensor

    @staticmethod
    def at(freqs: torch.Tensor, positions: torch.Tensor) -> RopeTable:
        rotation = torch.complex(*cos_sin(freqs, positions))
        return RopeTable(rotation, rotation.conj().resolve_conj())


def apply_rope(x: torch.Tensor, table: RopeTable, inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing rope channels of ``x [T, ..., D]``; pairs are (2i, 2i+1).

    ``inverse`` rotates by ``-angle`` (used to undo RoPE on the attention output). The rotation
    multiplies an fp32 copy of ``x`` in place (exact: the other channels round-trip)."""
    half = table.rotation.shape[-1]
    rotation = table.inverse if inverse else table.rotation
    out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    pairs = torch.view_as_complex(out[..., -2 * half :].unflatten(-1, (half, 2)))  # [T, ..., half]
    pairs.mul_(rotation.view(rotation.shape[0], *([1] * (x.dim() - 2)), half))
    return out.to(x.dtype)
