"""Compressors (CSA / HCA) and the lightning indexer, over one sequence's new tokens.

A compressor folds every ``rate`` tokens into one entry: a softmax-gated (per channel)
sum of the tokens' projections plus a learned position bias, RMS-normed, then roped at
the entry's first token position. The overlapping (CSA) variant projects each token to
two series: entry ``w`` pools window ``w-1``'s first series with window ``w``'s second
(width ``2 * rate``, stride ``rate``).
"""

from __future__ import annotations

import torch

from .norms import rms_norm
from .rope import RopeTable, apply_rope
from .state import CompressorState
from .weights import Compressor


def compress(
    weights: Compressor,
    state: CompressorState,
    kv: torch.Tensor,
    gate: torch.Tensor,
    first_entry: int,
    freqs: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Fold ``kv, gate [L, width]`` into the running state; return new entries [n, dim].

    ``first_entry`` is the number of entries this compressor emitted before; entry ``i``
    covers tokens ``[i * rate, (i + 1) * rate)`` and is roped at position ``i * rate``.
    """
    rate, width = weights.ape.shape
    dim = weights.norm.weight.shape[0]
    kv = torch.cat((state.buffer_kv, kv))
    gate = torch.cat((state.buffer_gate, gate))
    usable = kv.shape[0] // rate * rate
    state.buffer_kv, state.buffer_gate = kv[usable:], gate[usable:]
    n = usable // rate
    if n == 0:
        return kv.new_empty(0, dim)
    kv = kv[:usable].view(n, rate, width)
    gate = gate[:usable].view(n, rate, width) + weights.ape
    if width == 2 * dim:  # overlapping windows: [previous window's series a | this window's series b]
        pooled_kv = kv.new_zeros(n, 2 * rate, dim)
        pooled_gate = gate.new_full((n, 2 * rate, dim), float("-inf"))
        pooled_kv[:, rate:], pooled_gate[:, rate:] = kv[..., dim:], gate[..., dim:]
        pooled_kv[1:, :rate], pooled_gate[1:, :rate] = kv[:-1, :, :dim], gate[:-1, :, :dim]
        if state.overlap_kv is not None:
            pooled_kv[0, :rate], pooled_gate[0, :rate] = state.overlap_kv, state.overlap_gate
        state.overlap_kv, state.overlap_gate = kv[-1, :, :dim].clone(), gate[-1, :, :dim].clone()
        kv, gate = pooled_kv, pooled_gate
    weights_ = gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)
    entries = rms_norm((kv * weights_).sum(dim=1), weights.norm.weight, eps)
    positions = (torch.arange(n, device=kv.device) + first_entry) * rate
    return apply_rope(entries, RopeTable.at(freqs, positions))


def visible_entries(positions: torch.Tensor, rate: int) -> torch.Tensor:
    """[L] number of compressed entries a query at each position may see (causality)."""
    return torch.div(positions + 1, rate, rounding_mode="floor")


def index_topk(
    q: torch.Tensor,
    head_weights: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor,
    topk: int,
) -> torch.Tensor:
    """Select compressed entries per query: [L, N] bool.

    q [L, Hi, Di] roped indexer queries; head_weights [L, Hi] (already scaled by Hi^-0.5);
    keys [N, Di]; visible [L]. Score ``sum_h w_h * relu(q_h . k) * Di^-0.5``; the top
    ``topk`` among the visible entries are selected (fewer when fewer are visible).
    """
    n = keys.shape[0]
    scores = torch.relu(torch.einsum("lhd,nd->lhn", q.float(), keys.float())) * q.shape[-1] ** -0.5
    scores = (scores * head_weights.float()[..., None]).sum(dim=1)  # [L, N]
    entry = torch.arange(n, device=keys.device)
    hidden = entry[None, :] >= visible[:, None]
    scores = scores.masked_fill(hidden, float("-inf"))
    # stable sort, not topk: exact ties (all heads' ReLU at 0) go to the earliest entry,
    # so the choice does not depend on how the sequence was chunked
    picked = scores.sort(dim=-1, descending=True, stable=True).indices[:, :topk]  # [L, k]
    picked_ok = picked < visible[:, None]
    selected = torch.zeros(q.shape[0], n + 1, dtype=torch.bool, device=keys.device)
    selected.scatter_(1, torch.where(picked_ok, picked, n), True)
    return selected[:, :n]
