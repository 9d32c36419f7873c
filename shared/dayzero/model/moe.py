"""Mixture of experts: hash or top-k routing, clamped SwiGLU experts, one shared expert (split by
expert range and shared-expert rows over tensor-parallel ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels.batch import Backend
from ..kernels.moe import grouped_mxfp4_matmul
from ..parallel import Group
from ..quant.experts import PackedExperts
from .weights import Experts, MoE

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


def moe(
    w: MoE, cfg: ModelConfig, x: torch.Tensor, token_ids: torch.Tensor, backend: Backend, comm: Group
) -> torch.Tensor:
    """x [T, H] -> [T, H]: routed experts (tokens grouped by expert) plus the shared expert.

    Over ``comm``'s ranks every rank routes every token (the gate is replicated) and runs the
    pairs routed to its own experts and its rows of the shared expert; the sum is all-reduced."""
    experts, weights = route(w, cfg, x, token_ids)
    first, n_local = comm.config.span(cfg.n_routed_experts)[0], comm.config.part(cfg.n_routed_experts)
    local = experts.flatten() - first
    if comm.size > 1:  # another rank's pairs go to a last bucket, sorted after this rank's
        local = torch.where((local >= 0) & (local < n_local), local, n_local)
    order = local.argsort(stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(local, minlength=n_local + 1)[:n_local]
    if comm.size > 1:
        order = order[: int(counts.sum())]
    tokens = order // experts.shape[1]  # [pairs] token of each sorted pair
    pair_weights = weights.flatten()[order, None]
    if isinstance(w.experts, PackedExperts) and backend == "triton":
        routed = _fused_mxfp4(w.experts, cfg, x[tokens], counts)
    else:
        routed = _per_expert(w.experts, cfg, x[tokens], counts.tolist())
    out = torch.zeros_like(x).index_add_(0, tokens, (routed * pair_weights).to(x.dtype))
    se = w.shared_experts
    return comm.all_reduce_sum(out + se.w2(swiglu(se.w1(x), se.w3(x), cfg.swiglu_limit)))


def _per_expert(
    experts: Experts | PackedExperts, cfg: ModelConfig, xs: torch.Tensor, counts: list[int]
) -> torch.Tensor:
    """Sorted rows ``xs`` through their experts' float weights (packed: dequantized on demand)."""
    hit = [e for e, c in enumerate(counts) if c]
    if isinstance(experts, PackedExperts):
        mats = experts.converter.weights(experts, hit)
    else:
        mats = {e: (experts.w1[e], experts.w2[e], experts.w3[e]) for e in hit}
    out, start = torch.empty_like(xs), 0
    for e in hit:
        rows = slice(start, start + counts[e])
        start += counts[e]
        w1, w2, w3 = mats[e]
        out[rows] = F.linear(swiglu(F.linear(xs[rows], w1), F.linear(xs[rows], w3), cfg.swiglu_limit), w2)
    return out


def _fused_mxfp4(experts: PackedExperts, cfg: ModelConfig, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The same through the grouped MXFP4 kernel: no dequantized weight is ever materialised."""
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=xs.device)
    offsets[1:] = counts.cumsum(0)
    gate = grouped_mxfp4_matmul(xs, experts.w1, experts.w1_scale, offsets, "triton")
    up = grouped_mxfp4_matmul(xs, experts.w3, experts.w3_scale, offsets, "triton")
    hidden = swiglu(gate, up, cfg.swiglu_limit)
    return grouped_mxfp4_matmul(hidden, experts.w2, experts.w2_scale, offsets, "triton").to(xs.dtype)
