"""Mixture of experts: hash or top-k routing, clamped SwiGLU experts, one shared expert (split by
expert range and shared-expert rows over tensor-parallel ranks)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels.batch import Backend, from_host
from ..kernels.moe import swiglu
from ..parallel import Group
from .weights import MoE

_SCORE = {
    "sqrtsoftplus": lambda logits: F.softplus(logits).sqrt(),
    "sigmoid": torch.sigmoid,
    "softmax": lambda logits: logits.softmax(dim=-1),
}


def route(w: MoE, cfg: ModelConfig, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (expert ids [T, k] long, weights [T, k]).

    Hash layers take the experts from ``tid2eid[token]``; others the top-k of
    score + correction bias. Weights are the chosen scores, normalised (softmax scores,
    a distribution over every expert already, are not: DeepSeek's ``Gate``), times the
    routed scaling factor.
    """
    scores = _SCORE[cfg.scoring_func](F.linear(x, w.gate.weight))
    if hasattr(w.gate, "tid2eid"):
        experts = w.gate.tid2eid[token_ids].long()
    else:
        experts = torch.topk(scores + w.gate.bias, cfg.num_experts_per_tok, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if cfg.scoring_func != "softmax":
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * cfg.routed_scaling_factor


class RoutedExperts(Protocol):
    """A layer's routed experts in whatever format the checkpoint loaded them (float weights, or
    MXFP4 kept packed): the MoE hands them rows sorted by expert and never asks which."""

    def run(self, xs: torch.Tensor, counts: torch.Tensor, most: int, limit: float, backend: Backend) -> torch.Tensor:
        """xs [P, H] sorted by expert, counts [E_local] long -> [P, H] (kernels.expert_mlp). No expert
        has more than ``most`` rows (the step's tokens: a token picks an expert once), a bound the
        host knows without reading ``counts`` back from the device."""


HOST_GROUPED_PAIRS = 32  # routed pairs up to which one CPU rank groups them in numpy (faster up to ~32-64)


def _group_pairs(experts: torch.Tensor, n_experts: int, comm: Group) -> tuple[torch.Tensor, torch.Tensor]:
    """experts [T, k] -> the (token, slot) pairs grouped by expert [P] long (a stable sort: in pair
    order within an expert; another rank's pairs left out) and this rank's experts' counts [E_local]
    long. One rank's CPU step sorts and counts the ids on the host (read back: nothing to wait for),
    the same order and counts: torch's stable argsort and the scatter that counted, five small ops,
    were ~20 us of a demo layer's MoE. Only a few pairs (``HOST_GROUPED_PAIRS``: a decode batch's): a
    prefill chunk's hundreds read back as Python ints took ~1 ms a layer (bench/group_pairs.py)."""
    first, n_local = comm.config.span(n_experts)[0], comm.config.part(n_experts)
    if comm.size == 1 and experts.is_cpu and experts.numel() <= HOST_GROUPED_PAIRS:
        ids = np.array(experts.tolist(), dtype=np.int64).reshape(-1)  # (``tolist``: resolve_conj / _neg)
        return from_host(np.argsort(ids, kind="stable"), "cpu"), from_host(np.bincount(ids, minlength=n_local), "cpu")
    local = experts.flatten() - first if first else experts.flatten()
    if comm.size > 1:  # another rank's pairs go to a last bucket, sorted after this rank's
        local = torch.where((local >= 0) & (local < n_local), local, n_local)
    order = local.argsort(stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.zeros(n_local + 1, dtype=torch.long, device=local.device)
    counts = counts.scatter_add_(0, local, torch.ones_like(local))[:n_local]  # (bincount waits for a GPU)
    if comm.size > 1:
        order = order[: int(counts.sum())]
    return order, counts


def moe(
    w: MoE, cfg: ModelConfig, x: torch.Tensor, token_ids: torch.Tensor, backend: Backend, comm: Group
) -> torch.Tensor:
    """x [T, H] -> [T, H]: routed experts (tokens grouped by expert) plus the shared expert.

    Over ``comm``'s ranks every rank routes every token (the gate is replicated) and runs the
    pairs routed to its own experts and its rows of the shared expert; the sum is all-reduced."""
    experts, weights = route(w, cfg, x, token_ids)
    order, counts = _group_pairs(experts, cfg.n_routed_experts, comm)
    pair_weights = weights.flatten()[order, None]
    routed_experts: RoutedExperts = w.experts
    if x.shape[0] == 1:  # one token (decode at batch 1): every pair is its own, summed at once
        routed = routed_experts.run(x.expand(order.shape[0], -1), counts, 1, cfg.swiglu_limit, backend)
        out = (routed * pair_weights).to(x.dtype).sum(dim=0, keepdim=True)
    else:
        tokens = order // experts.shape[1]  # [pairs] token of each sorted pair
        routed = routed_experts.run(x[tokens], counts, x.shape[0], cfg.swiglu_limit, backend)
        # each pair back at its (token, slot) place (zero: another rank's pair), then the slots summed
        placed = x.new_zeros(experts.numel(), x.shape[1])  # [T * k, H]
        placed[order] = (routed * pair_weights).to(x.dtype)
        out = placed.view(*experts.shape, -1).sum(dim=1)
    se = w.shared_experts
    hidden = swiglu(F.linear(x, se.w1.weight), F.linear(x, se.w3.weight), cfg.swiglu_limit, backend)
    return comm.all_reduce_sum(out + F.linear(hidden, se.w2.weight))
