"""Compressor glue: join buffered and new projections into complete windows, keep the rest.

A compressor folds every ``rate`` tokens into one entry (kernel: ``compress_entries``).
The overlapping (CSA) variant projects each token to two series: entry ``w`` pools
window ``w-1``'s first series with window ``w``'s second (width 2 * rate, stride rate).
The running state of each sequence sits in the compressor pool: the rows of the
incomplete window (``length % rate`` of them) and, for CSA, the previous window's
first series (kv, and gate with the position bias added).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import compress_entries
from .plan import StepPlan
from .rope import RopeTable
from .weights import Compressor


@dataclass(frozen=True, slots=True)
class CompressorSlots:
    """One layer's compressor state: [slots, rate, width] tensors (overlap: CSA only)."""

    kv: torch.Tensor
    gate: torch.Tensor
    overlap_kv: torch.Tensor | None = None
    overlap_gate: torch.Tensor | None = None


def _windows(
    w: Compressor, state: CompressorSlots, slot: int, kv: torch.Tensor, gate: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Complete windows of one sequence as [n, rows, dim] kv / gate; updates the slot."""
    rate, width = w.ape.shape
    dim = w.norm.weight.shape[0]
    buffered = start % rate
    kv = torch.cat((state.kv[slot, :buffered], kv.float()))
    gate = torch.cat((state.gate[slot, :buffered], gate.float()))
    n = kv.shape[0] // rate
    used = n * rate
    rest = kv.shape[0] - used
    state.kv[slot, :rest], state.gate[slot, :rest] = kv[used:], gate[used:]
    if n == 0:
        return None
    kv, gate = kv[:used].view(n, rate, width), gate[:used].view(n, rate, width) + w.ape
    if state.overlap_kv is None:
        return kv, gate
    pooled_kv = kv.new_zeros(n, 2 * rate, dim)
    pooled_gate = gate.new_full((n, 2 * rate, dim), float("-inf"))
    pooled_kv[:, rate:], pooled_gate[:, rate:] = kv[..., dim:], gate[..., dim:]
    pooled_kv[1:, :rate], pooled_gate[1:, :rate] = kv[:-1, :, :dim], gate[:-1, :, :dim]
    if start >= rate:  # the previous window closed in an earlier step
        pooled_kv[0, :rate], pooled_gate[0, :rate] = state.overlap_kv[slot], state.overlap_gate[slot]
    state.overlap_kv[slot], state.overlap_gate[slot] = kv[-1, :, :dim], gate[-1, :, :dim]
    return pooled_kv, pooled_gate


def fold(
    w: Compressor,
    state: CompressorSlots,
    kv: torch.Tensor,
    gate: torch.Tensor,
    plan: StepPlan,
    pool: torch.Tensor,
    table: torch.Tensor,
    eps: float,
) -> None:
    """Fold the step's projections ``kv, gate [T, width]`` into entries appended to ``pool``."""
    rate = w.ape.shape[0]
    batch = plan.batch
    parts_kv, parts_gate, seqs, entries = [], [], [], []
    for s in range(batch.num_seqs):
        rows, start = batch.rows(s), batch.starts[s]
        windows = _windows(w, state, plan.slots[s], kv[rows], gate[rows], start)
        if windows is None:
            continue
        parts_kv.append(windows[0])
        parts_gate.append(windows[1])
        first = start // rate
        entries.append(torch.arange(first, first + windows[0].shape[0]))
        seqs.append(torch.full((windows[0].shape[0],), s))
    if not parts_kv:
        return
    entry = torch.cat(entries).to(kv.device)
    rope = RopeTable.at(plan.freqs_compress, entry * rate)
    compress_entries(
        torch.cat(parts_kv),
        torch.cat(parts_gate),
        w.norm.weight,
        rope.cos,
        rope.sin,
        eps,
        pool,
        table,
        torch.cat(seqs).to(kv.device),
        entry,
        plan.options.backend,
    )
