"""The routed experts' clamped SwiGLU MLP over rows sorted by expert, from float weights, in torch
(the MXFP4 weights' grouped kernel and the SwiGLU kernel: ``kernels.moe``).

xs      [P, H]   rows sorted by expert (``counts[e]`` rows for local expert e, in order)
counts  [E]      long
out     [P, H]   each row through its expert: w2 @ (silu(clamp(w1 x)) * clamp(w3 x))
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # float (w1 [I, H], w2 [H, I], w3 [I, H])
# The multiply-adds padding may add per expert and still cost less than the three matmul calls it
# saves (~10 us each on a CPU core): about what a core does in one such call
PADDING_PER_EXPERT = 1 << 18


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def expert_mlp(
    xs: torch.Tensor, sizes: list[int], weights_of: Callable[[list[int]], dict[int, Weights]], limit: float
) -> torch.Tensor:
    """One matmul chain per expert that has rows (``sizes``: ``counts`` read to the host);
    ``weights_of(ids)`` gives the hit experts' float weights."""
    hit = [e for e, c in enumerate(sizes) if c]
    mats, out, start = weights_of(hit), torch.empty_like(xs), 0
    for e in hit:
        rows = slice(start, start + sizes[e])
        start += sizes[e]
        w1, w2, w3 = mats[e]
        x = xs[rows]
        out[rows] = F.linear(swiglu_torch(F.linear(x, w1), F.linear(x, w3), limit), w2)
    return out


def pads_cheaply(sizes: list[int], inter: int, hidden: int) -> bool:
    """Whether ``expert_mlp_stacked`` beats the loop for rows ``sizes`` per expert: every expert has
    rows (none's weights multiplied for nothing) and padding each to the busiest's adds fewer
    multiply-adds than ``PADDING_PER_EXPERT`` per expert (a decode step's few rows per expert)."""
    padding = len(sizes) * max(sizes) - sum(sizes)
    return all(sizes) and padding * inter * hidden <= PADDING_PER_EXPERT * len(sizes)


def expert_mlp_stacked(
    xs: torch.Tensor,
    counts: torch.Tensor,
    busiest: int,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """``expert_mlp`` over every expert's stacked float weights (w1 [E, I, H], w2 [E, H, I], w3):
    each expert's rows padded with zeros to the ``busiest``'s count, then three batched matmuls
    whatever the number of experts (the loop makes three calls an expert)."""
    experts = counts.numel()
    # [P] each row's expert (its size given: sized by ``counts`` it would wait for the device)
    expert = torch.repeat_interleave(torch.arange(experts, device=xs.device), counts, output_size=xs.shape[0])
    first = torch.cumsum(counts, 0) - counts  # [E] each expert's first row
    slot = torch.arange(xs.shape[0], device=xs.device) - first[expert]  # [P] each row's place in its expert's
    rows = xs.new_zeros(experts, busiest, xs.shape[1])
    rows[expert, slot] = xs
    hidden = swiglu_torch(torch.bmm(rows, w1.transpose(1, 2)), torch.bmm(rows, w3.transpose(1, 2)), limit)
    return torch.bmm(hidden, w2.transpose(1, 2))[expert, slot]
