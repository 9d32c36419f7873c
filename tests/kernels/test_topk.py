"""The indexer's top-k: a stable sort's first k (score descending, ties to the earliest entry)."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels.topk import SORTED_OUTRIGHT, earliest_topk, keyed_topk, scanned_topk


def _stable_sorts_prefix(scores: torch.Tensor, k: int) -> torch.Tensor:
    ordered = scores.sort(dim=1, descending=True, stable=True)  # NaN first, as torch ranks it
    return ordered.indices.masked_fill(torch.isneginf(ordered.values), -1)[:, :k]


def _tied_scores(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (rows, 12), generator=gen).float()  # many ties, negative ones too
    scores[::3, 5:] = float("-inf")  # fewer finite entries than k in some rows
    scores[1] = torch.randn(12, generator=gen)  # a row without ties
    scores[2, 3], scores[2, 7] = -0.0, 0.0  # equal scores, different bits
    return scores


@pytest.mark.parametrize("rows", [8, 256])  # 8 x 12 scores are sorted outright; 256 x 12 take topk + tie checks
def test_earliest_topk_is_a_stable_sorts_prefix(rows):
    """Ties (at the k-th score, inside the selection, among -inf) resolve as a stable sort does."""
    assert (rows * 12 <= SORTED_OUTRIGHT) == (rows == 8)
    scores = _tied_scores(rows, seed=11)
    for k in (1, 5, 12, 15):
        want = _stable_sorts_prefix(scores, k)
        got = earliest_topk(scores, k)
        assert torch.equal(got[:, : want.shape[1]], want) and bool((got[:, want.shape[1] :] == -1).all())


def test_keyed_topk_is_a_stable_sorts_prefix():
    """The GPU's way (no tie check read back): the same selection, ties, -0.0, -inf and the most
    negative finite score included, and on wide rows of random scores."""
    scores = _tied_scores(64, seed=12)
    scores[4, 0] = -torch.finfo(torch.float32).max
    for k in (1, 5, 12):
        assert torch.equal(keyed_topk(scores, k), _stable_sorts_prefix(scores, k))
    wide = torch.randn(3, 5000, generator=torch.Generator().manual_seed(13)).round(decimals=1)  # ties
    wide[1, 2500:] = float("-inf")
    assert torch.equal(keyed_topk(wide, 512), _stable_sorts_prefix(wide, 512))


def test_scanned_topk_is_a_stable_sorts_prefix():
    """The CPU's one pass a row: the same selection, ties, -0.0, -inf and the most negative finite
    score included, k above a row's finite entries and above its width, and on wide rows."""
    scores = _tied_scores(64, seed=14)
    scores[4, 0] = -torch.finfo(torch.float32).max
    for k in (1, 5, 12, 15):
        want = _stable_sorts_prefix(scores, k)
        got = scanned_topk(scores, k, torch.zeros(64, k, dtype=torch.int32))
        assert torch.equal(got[:, :12].long(), want) and bool((got[:, 12:] == -1).all())
    wide = torch.randn(3, 5000, generator=torch.Generator().manual_seed(15)).round(decimals=1)  # ties
    wide[1, 2500:] = float("-inf")
    got = scanned_topk(wide, 64, torch.zeros(3, 64, dtype=torch.int32))
    assert torch.equal(got.long(), _stable_sorts_prefix(wide, 64))


def _scores_with_nan_and_inf(rows: int, width: int, seed: int) -> torch.Tensor:
    """Random finite scores with NaN (both signs: x86's inf - inf is 0xFFC00000), +inf and -inf
    injected, several of each in some rows (ties among them), a row of NaN only."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, width, generator=gen)
    negative_nan = (torch.tensor(float("inf")) - float("inf")).item()
    for value, share in ((float("nan"), 0.05), (negative_nan, 0.05), (float("inf"), 0.05), (float("-inf"), 0.2)):
        scores[torch.rand(rows, width, generator=gen) < share] = value
    scores[0] = float("nan")
    return scores


@pytest.mark.parametrize("rows, width", [(4, 24), (64, 300)])  # sorted outright, topk + tie checks
def test_nan_and_inf_scores_are_picked_as_torchs_topk_ranks_them(rows, width):
    """NaN ranks above +inf, +inf above every finite score (torch's topk and sort, so transformers'
    indexer, rank them so), ties among them to the earliest entry, -inf never picked (-1): the
    CPU's one pass, the torch twin and the GPU's keys pick alike, the set torch's topk picks."""
    scores = _scores_with_nan_and_inf(rows, width, seed=16)
    for k in (1, 3, 8, 40):
        want = _stable_sorts_prefix(scores, k)
        assert torch.equal(earliest_topk(scores, k)[:, : want.shape[1]], want), k
        assert torch.equal(keyed_topk(scores, k) if k <= width else want, want), k
        if k <= 64:
            scanned = scanned_topk(scores, k, torch.zeros(rows, k, dtype=torch.int32)).long()
            assert torch.equal(scanned[:, : want.shape[1]], want), k
        if k <= width:  # the values picked are those torch's topk picks, row by row
            picked = scores.gather(1, want.clamp(min=0)).masked_fill(want < 0, float("-inf"))
            assert torch.equal(picked.nan_to_num(), scores.topk(k, dim=1).values.nan_to_num()), k
