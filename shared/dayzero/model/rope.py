"""Interleaved partial RoPE on the trailing ``rope_dim`` channels of each head.

Two tables exist per model: ``main`` (sliding-only layers) and ``compress`` (CSA / HCA
layers, their compressors and the indexer), optionally YaRN-scaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import RopeConfig
from ..kernels.batch import Backend
from ..kernels.rope import rotate


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
    multiplying by a lazy ``conj()`` resolves it on every call); on the CPU ``host`` holds their
    numpy views (rotation, inverse) for the compiled loop, viewed once a step, not once a call."""

    rotation: torch.Tensor
    inverse: torch.Tensor
    host: tuple[np.ndarray, np.ndarray] | None = None

    @staticmethod
    def at(freqs: torch.Tensor, positions: torch.Tensor) -> RopeTable:
        rotation = torch.complex(*cos_sin(freqs, positions))
        if not rotation.is_cpu:
            return RopeTable(rotation, rotation.conj().resolve_conj())
        host = rotation.numpy()
        inverse = np.conj(host)  # (numpy's: torch's conj and resolve_conj, then its view, are six aten ops)
        return RopeTable(rotation, torch.from_numpy(inverse), (host, inverse))


def apply_rope(x: torch.Tensor, table: RopeTable, inverse: bool = False, backend: Backend = "torch") -> torch.Tensor:
    """Rotate the trailing rope channels of ``x [T, ..., D]``; pairs are (2i, 2i+1) (kernels.rope).

    ``inverse`` rotates by ``-angle`` (used to undo RoPE on the attention output)."""
    host = None if table.host is None else table.host[inverse]
    return rotate(x, table.inverse if inverse else table.rotation, backend, host)
