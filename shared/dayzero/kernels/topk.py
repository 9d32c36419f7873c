"""The indexer's selection: the k highest scores of each row, ties to the earliest entry (the order
of a stable sort, as DeepSeek's reference and transformers take ``topk`` of fp32 scores). Scores
rank as torch's ``topk`` and ``sort`` rank them, so as transformers' indexer picks: NaN (either
sign) above +inf, +inf above every finite score; -inf (the mask of entries a query cannot see) is
never picked: its slot is -1."""

from __future__ import annotations

import numba
import numpy as np
import torch

SORTED_OUTRIGHT = 2048  # scores per top-k up to which one stable sort beats topk + tie checks (CPU: 44 vs 181 us)


def keyed_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``earliest_topk`` in one ``topk`` over int64 keys that order as (score descending, entry
    ascending): the fp32 score's bits made order-keeping as a signed int (negative scores' lower 31
    bits flipped; -0.0 taken as +0.0, its equal; every NaN as the positive quiet one) above the
    entry's complement. No value is read back to the host (the tie checks' are: a GPU stall, and no
    capture in a CUDA graph), at the cost of int64 keys (CPU: ~1.3x the tie checks' time, so CPUs
    keep those). ``scores`` [R, n >= k]."""
    bits = torch.where(scores.isnan(), _NAN_BITS, (scores + 0.0).view(torch.int32))  # one NaN, above +inf
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    entries = torch.arange(_LOW, _LOW - scores.shape[1], -1, device=scores.device)
    top = ordered.mul_(1 << 32).add_(entries).topk(k, dim=1).values
    return (_LOW - (top & 0xFFFFFFFF)).masked_fill_(top <= _NEG_INF_KEY, -1)


@numba.njit(cache=True)
def _scan_topk(scores, k, out):
    """Each row's k best (score descending, entry ascending) by one pass in entry order: an entry
    enters only above the k-th best, after every equal score already kept (those are earlier);
    -inf never enters (its slot keeps -1). NaN ranks above every number (torch's order): it enters
    while a number is kept, and a row is done once its k kept are all NaN."""
    vals = np.empty(k, np.float32)
    for r in range(scores.shape[0]):
        vals[:] = -np.inf
        out[r, :] = -1
        last = vals[k - 1]  # the k-th best, held in a register: the scan between entries runs ~8x faster
        for e in range(scores.shape[1]):
            s = scores[r, e]
            if not s <= last:  # above the k-th best, or NaN (the k-th best is a number here)
                nan = s != s
                p = k - 1
                while p > 0 and (vals[p - 1] < s or (nan and vals[p - 1] == vals[p - 1])):
                    vals[p], out[r, p] = vals[p - 1], out[r, p - 1]
                    p -= 1
                vals[p], out[r, p] = s, e
                last = vals[k - 1]
                if last != last:  # k NaN kept: no later entry ranks above them
                    break
    return out


def scanned_topk(scores: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """``earliest_topk`` of fp32 CPU ``scores`` [R, n] (contiguous rows) into int32 ``out`` [R, k] by a
    compiled pass over each row: torch's topk and tie checks take ~6 ms CPU for [512, 8192] (k = 4 on
    the demo; ~200 ms where most rows tie), the pass ~1.8 (bench/indexer_block.py, load 10 on two
    cores: 11-17 before the k-th best was held in a register); its shifts cost up to k an entry, so
    for a small k only (SCAN_TOPK_MAX)."""
    _scan_topk(scores.numpy(), k, out.numpy())
    return out


SCAN_TOPK_MAX = 64  # largest k selected by one pass (each entry that enters shifts up to k kept ones)
_LOW = (1 << 31) - 1  # an entry's part of a key: _LOW - entry
_NEG_INF_KEY = (-8388608 ^ 0x7FFFFFFF) * (1 << 32) + _LOW  # the highest key of a -inf score (bits 0xFF800000)
_NAN_BITS = 0x7FC00000  # the positive quiet NaN: every NaN's bits in a key (x86's inf - inf is 0xFFC00000)


def earliest_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[R, k] long entry ids of the ``k`` highest scores of each row of [R, n], ordered by (score
    descending, entry ascending; NaN first, as torch sorts): a stable full sort's first ``k``; -1 for
    -inf scores.

    ``topk`` picks the set (the k + 1 highest: a tie at the k-th score is the (k + 1)-th equal to
    it); only rows where it could differ from the stable sort (a tie at the k-th score, or two equal
    scores inside the selection; NaN ties NaN, -inf ties go to -1 in any order) are sorted. Scores of
    a few thousand at most (a decode row early in a context) are sorted outright: fewer ops than the
    tie checks. On a GPU, ``keyed_topk`` instead of the tie checks (which wait for the device)."""
    if scores.shape[1] <= k:
        scores = torch.cat((scores, scores.new_full((scores.shape[0], k + 1 - scores.shape[1]), float("-inf"))), 1)
    if scores.numel() <= SORTED_OUTRIGHT:
        vals, idx = scores.sort(dim=1, descending=True, stable=True)
        return idx[:, :k].masked_fill_(torch.isneginf(vals[:, :k]), -1)
    if scores.is_cuda:
        return keyed_topk(scores, k)
    vals, idx = scores.topk(k + 1, dim=1)
    after, vals, idx = vals[:, k], vals[:, :k], idx[:, :k]
    boundary = _ties(after, vals[:, -1])
    inner = _ties(vals[:, 1:], vals[:, :-1]).any(dim=1)
    tied = (boundary | inner).nonzero()[:, 0]
    if tied.numel():
        ordered = scores[tied].sort(dim=1, descending=True, stable=True)
        vals[tied], idx[tied] = ordered.values[:, :k], ordered.indices[:, :k]
    return idx.masked_fill_(torch.isneginf(vals), -1)


def _ties(later: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """Where two ranked scores tie in an order that matters: equal, or both NaN; not -inf (never picked)."""
    return ((later == earlier) | (later.isnan() & earlier.isnan())) & ~later.isneginf()
