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
from .plan import Closing, StepPlan
from .rope import cos_sin
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
    prev_kv = torch.cat((state.overlap_kv[slot][None], kv[:-1, :, :dim]))
    prev_gate = torch.cat((state.overlap_gate[slot][None], gate[:-1, :, :dim]))
    has_prev = torch.ones(n, dtype=torch.bool, device=kv.device)
    has_prev[0] = start >= rate  # the first window's predecessor closed in an earlier step, if any
    pooled = _pool_overlap(kv, gate, prev_kv, prev_gate, has_prev)
    state.overlap_kv[slot], state.overlap_gate[slot] = kv[-1, :, :dim], gate[-1, :, :dim]
    return pooled


def _pool_overlap(
    kv: torch.Tensor, gate: torch.Tensor, prev_kv: torch.Tensor, prev_gate: torch.Tensor, has_prev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSA: each window's second series after the previous window's first series (``prev_*``, none
    where ``has_prev`` is false): windows [n, rate, 2 * dim] -> pooled [n, 2 * rate, dim]."""
    dim = kv.shape[2] // 2
    has_prev = has_prev[:, None, None]  # selected, not indexed: a mask's index waits for the device
    first_kv, first_gate = torch.where(has_prev, prev_kv, 0.0), torch.where(has_prev, prev_gate, float("-inf"))
    return torch.cat((first_kv, kv[..., dim:]), 1), torch.cat((first_gate, gate[..., dim:]), 1)


Windows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # kv, gate, their sequences and entries


def _fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32, the buffer's type: ``float()`` of an fp32 tensor is still an aten op (``to``),
    two a compressor a decode step, 10 of a demo step's."""
    return x if x.dtype == torch.float32 else x.float()


def _decode_windows(
    w: Compressor,
    state: CompressorSlots,
    kv: torch.Tensor,
    gate: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    closing: Closing | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One new token each for some sequences (in compressor ``slots``; ``rows``: its row in the
    window, position % rate), all at once: buffer each row -> the kv, gate of the windows the
    ``closing`` tokens complete."""
    width = w.ape.shape[1]
    state.kv.index_put_((slots, rows), _fp32(kv))  # (``state.kv[slots, rows] =`` views a single row first)
    state.gate.index_put_((slots, rows), _fp32(gate))
    if closing is None:
        return None
    windows_kv, windows_gate = state.kv[closing.slots], state.gate[closing.slots] + w.ape
    if state.overlap_kv is not None:
        prev_kv, prev_gate = state.overlap_kv[closing.slots], state.overlap_gate[closing.slots]
        dim = width // 2
        state.overlap_kv[closing.slots] = windows_kv[:, :, :dim]
        state.overlap_gate[closing.slots] = windows_gate[:, :, :dim]
        windows_kv, windows_gate = _pool_overlap(windows_kv, windows_gate, prev_kv, prev_gate, closing.has_prev)
    return windows_kv, windows_gate


def _step_windows(
    w: Compressor, state: CompressorSlots, kv: torch.Tensor, gate: torch.Tensor, plan: StepPlan
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A few new tokens per sequence (decode: one; a speculative verify: k + 1): one pass per column
    of the plan (every sequence's j-th new token), in order, no loop over sequences -> the kv, gate
    of the windows ``plan.closed`` lists."""
    rate, found = w.ape.shape[0], []
    for column in plan.columns:
        rows_kv, rows_gate = (kv, gate) if column.rows is None else (kv[column.rows], gate[column.rows])
        windows = _decode_windows(
            w, state, rows_kv, rows_gate, column.slots, column.window_rows[rate], column.closing[rate]
        )
        if windows is not None:
            found.append(windows)
    if len(found) < 2:
        return found[0] if found else None
    return torch.cat([f[0] for f in found]), torch.cat([f[1] for f in found])


def _sequence_windows(
    w: Compressor, state: CompressorSlots, kv: torch.Tensor, gate: torch.Tensor, plan: StepPlan
) -> Windows | None:
    """Any number of new tokens per sequence, one sequence at a time -> ``Windows`` or None."""
    batch, rate = plan.batch, w.ape.shape[0]
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
        return None
    return torch.cat(parts_kv), torch.cat(parts_gate), torch.cat(seqs).to(kv.device), torch.cat(entries).to(kv.device)


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
    if plan.columns:  # a few tokens per sequence leave every new row in the buffer (a speculative rollback keeps them)
        windows = _step_windows(w, state, kv, gate, plan)
        if windows is None:
            return
        (windows_kv, windows_gate), closed = windows, plan.closed[rate]
        seq, entry, cos, sin = closed.seqs, closed.entries, closed.cos, closed.sin
    else:
        found = _sequence_windows(w, state, kv, gate, plan)
        if found is None:
            return
        windows_kv, windows_gate, seq, entry = found
        cos, sin = cos_sin(plan.freqs_compress, entry * rate)
    compress_entries(
        windows_kv,
        windows_gate,
        w.norm.weight,
        cos,
        sin,
        eps,
        pool,
        table,
        seq,
        entry,
        plan.options.backend,
    )
