"""Mixture of experts: hash or top-k routing, clamped SwiGLU experts, one shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from .weights import MoE

_SCORE = {
    "sqrtsoftplus": lambda logits: F.softplus(logits).sqrt(),
    "sigmoid": torch.sigmoid,
    "softmax": lambda logits: logits.softmax(dim=-1),
}


def route(w: MoE, cfg: ModelConfig, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (expert ids [T, k] long, weights [T, k]).

    Hash layers take the experts from ``tid2eid[token]``; others the top-k of
    score + correction bias. Weights are the chosen scores, normalised, times the
    routed scaling factor.
    """
    scores = _SCORE[cfg.scoring_func](F.linear(x, w.gate.weight))
    if hasattr(w.gate, "tid2eid"):
        experts = w.gate.tid2eid[token_ids].long()
    else:
        experts = torch.topk(scores + w.gate.bias, cfg.num_experts_per_tok, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * cfg.routed_scaling_factor


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def moe(w: MoE, cfg: ModelConfig, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """x [T, H] -> [T, H]: routed experts (tokens grouped by expert) plus the shared expert."""
    experts, weights = route(w, cfg, x, token_ids)
    flat_experts = experts.flatten()
    order = flat_experts.argsort(stable=True)
    counts = torch.bincount(flat_experts, minlength=cfg.n_routed_experts).tolist()
    token_of = order // experts.shape[1]
    out = torch.zeros_like(x)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        slots = order[start : start + count]
        tokens = token_of[start : start + count]
        start += count
        xe = x[tokens]
        h = swiglu(F.linear(xe, w.experts.w1[e]), F.linear(xe, w.experts.w3[e]), cfg.swiglu_limit)
        ye = F.linear(h, w.experts.w2[e]) * weights.flatten()[slots, None].to(x.dtype)
        out.index_add_(0, tokens, ye)
    se = w.shared_experts
    return out + se.w2(swiglu(se.w1(x), se.w3(x), cfg.swiglu_limit))
