"""The routed experts' clamped SwiGLU MLP over rows sorted by expert, for both weight formats.

xs      [P, H]   rows sorted by expert (``counts[e]`` rows for local expert e, in order)
counts  [E]      long
out     [P, H]   each row through its expert: w2 @ (silu(clamp(w1 x)) * clamp(w3 x))
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .batch import Backend
from .moe import grouped_mxfp4_matmul

Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # float (w1 [I, H], w2 [H, I], w3 [I, H])


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def expert_mlp(
    xs: torch.Tensor, counts: torch.Tensor, weights_of: Callable[[list[int]], dict[int, Weights]], limit: float
) -> torch.Tensor:
    """One matmul chain per expert that has rows; ``weights_of(ids)`` gives the hit experts' float weights."""
    sizes = counts.tolist()
    hit = [e for e, c in enumerate(sizes) if c]
    mats, out, start = weights_of(hit), torch.empty_like(xs), 0
    for e in hit:
        rows = slice(start, start + sizes[e])
        start += sizes[e]
        w1, w2, w3 = mats[e]
        x = xs[rows]
        out[rows] = F.linear(swiglu(F.linear(x, w1), F.linear(x, w3), limit), w2)
    return out


def expert_mlp_mxfp4(
    xs: torch.Tensor, counts: torch.Tensor, packed: dict[str, torch.Tensor], limit: float, backend: Backend
) -> torch.Tensor:
    """The same from MXFP4 weights through the grouped kernel (``packed``: w1, w1_scale, ... as
    PackedExperts holds them): no dequantized weight is ever materialised."""
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=xs.device)
    offsets[1:] = counts.cumsum(0)
    gate = grouped_mxfp4_matmul(xs, packed["w1"], packed["w1_scale"], offsets, backend)
    up = grouped_mxfp4_matmul(xs, packed["w3"], packed["w3_scale"], offsets, backend)
    hidden = swiglu(gate, up, limit)
    return grouped_mxfp4_matmul(hidden, packed["w2"], packed["w2_scale"], offsets, backend).to(xs.dtype)
