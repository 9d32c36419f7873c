"""Each Triton kernel (interpreted on CPU) against its torch twin, on small ragged shapes."""

from __future__ import annotations

import pytest
import torch

from dayzero.kernels import (
    CompressedKeys,
    RaggedBatch,
    compress_entries,
    indexer_topk,
    sparse_attention_decode,
    sparse_attention_prefill,
    write_window,
)
from dayzero.kernels.indexer_torch import indexer_scores_torch

BS, D, H, WINDOW = 4, 16, 4, 8


def _scenario(device, starts, news, seed=0, blocks=48):
    gen = torch.Generator().manual_seed(seed)
    batch = RaggedBatch.build(starts, news, device)
    t = sum(news)
    perm = torch.randperm(blocks, generator=gen).to(torch.int32)
    window_table = perm[: 2 * len(news)].view(len(news), 2)  # ring of 8 slots >= window - 1
    comp_table = perm[2 * len(news) : 2 * len(news) + 5 * len(news)].view(len(news), 5)
    tensors = dict(
        q=torch.randn(t, H, D, generator=gen),
        kv=torch.randn(t, D, generator=gen),
        window=torch.randn(blocks, BS, D, generator=gen),
        window_table=window_table,
        compressed=torch.randn(blocks, BS, D, generator=gen),
        comp_table=comp_table,
        sink=torch.randn(H, generator=gen),
    )
    return {**{k: v.to(device) for k, v in tensors.items()}, "batch": batch, "gen": gen, "device": device}


def _selection(sc, mode, rate=4, k=3):
    visible = torch.div(sc["batch"].positions + 1, rate, rounding_mode="floor").to(torch.int32)
    if mode == "none":
        return None
    if mode == "visible":
        return CompressedKeys(sc["compressed"], sc["comp_table"], visible=visible)
    rows = []
    for v in visible.cpu().tolist():
        choice = torch.randperm(v, generator=sc["gen"])[:k].tolist() if v else []
        rows.append(choice + [-1] * (k - len(choice)))  # fewer visible than k: -1 padding
    picks = torch.tensor(rows, dtype=torch.int32, device=sc["device"])
    return CompressedKeys(sc["compressed"], sc["comp_table"], indices=picks)


@pytest.mark.parametrize("mode", ["none", "visible", "indices"])
def test_prefill_attention_matches_twin(mode, device, tol):
    sc = _scenario(device, starts=[0, 5, 37], news=[6, 1, 9])  # ragged; ring partly filled for the first two
    sel = _selection(sc, mode)
    args = (sc["q"], sc["kv"], sc["batch"], sc["window"], sc["window_table"], WINDOW, sc["sink"], sel)
    want = sparse_attention_prefill(*args, backend="torch")
    got = sparse_attention_prefill(*args, backend="triton")
    assert (got - want).abs().max().item() < tol


@pytest.mark.parametrize("mode", ["none", "visible", "indices"])
def test_decode_attention_matches_twin(mode, device, tol):
    sc = _scenario(device, starts=[0, 3, 40, 17], news=[1, 1, 1, 1], seed=1)
    sel = _selection(sc, mode)
    args = (sc["q"], sc["kv"], sc["batch"], sc["window"], sc["window_table"], WINDOW, sc["sink"], sel)
    want = sparse_attention_decode(*args, backend="torch")
    got = sparse_attention_decode(*args, backend="triton", keys_per_split=5)  # several splits per sequence
    assert (got - want).abs().max().item() < tol


@pytest.mark.parametrize("mode", ["none", "visible", "indices"])
@pytest.mark.parametrize("news", [[1, 1, 1, 1, 1], [2, 3, 1, 4, 2]])  # decode; a verify of k + 1 tokens (padded)
def test_batched_decode_twin_equals_the_spec(mode, news, device, tol):
    from dayzero.kernels.attention_torch import sparse_attention_torch, sparse_decode_torch

    sc = _scenario(device, starts=[0, 3, 40, 17, 2], news=news, seed=8)  # ring empty, partial, full
    sel = _selection(sc, mode)
    args = (sc["q"], sc["kv"], sc["batch"], sc["window"], sc["window_table"], WINDOW, sc["sink"], sel)
    assert (sparse_decode_torch(*args) - sparse_attention_torch(*args)).abs().max().item() < tol


@pytest.mark.parametrize("mode", ["none", "visible", "indices"])
def test_spec_query_blocks_read_every_key_a_window_reaches(mode, device, tol, monkeypatch):
    """Blocks of 2 or 5 queries (some reaching the ring, some only the step's rows), or of one
    (a logits budget too small for more) = one block."""
    from dayzero.kernels import attention_torch

    sc = _scenario(device, starts=[0, 5, 37], news=[13, 1, 11], seed=9)
    sel = _selection(sc, mode)
    args = (sc["q"], sc["kv"], sc["batch"], sc["window"], sc["window_table"], WINDOW, sc["sink"], sel)
    whole = attention_torch.sparse_attention_torch(*args)
    for block, budget in ((2, attention_torch.BLOCK_LOGITS), (5, attention_torch.BLOCK_LOGITS), (64, 1)):
        monkeypatch.setattr(attention_torch, "QUERY_BLOCK", block)
        monkeypatch.setattr(attention_torch, "BLOCK_LOGITS", budget)
        assert attention_torch._block_rows(sc["q"].shape[1], WINDOW, 0) == min(block, max(1, budget))
        assert (attention_torch.sparse_attention_torch(*args) - whole).abs().max().item() < tol


def test_decode_and_prefill_twins_agree_on_single_tokens(device, tol):
    sc = _scenario(device, starts=[9, 2], news=[1, 1], seed=2)
    sel = _selection(sc, "indices")
    args = (sc["q"], sc["kv"], sc["batch"], sc["window"], sc["window_table"], WINDOW, sc["sink"], sel)
    got = sparse_attention_decode(*args, backend="triton")
    want = sparse_attention_prefill(*args, backend="triton")
    assert (got - want).abs().max().item() < tol


def test_window_write_matches_twin_and_keeps_the_last_positions(device):
    sc = _scenario(device, starts=[0, 5, 37], news=[11, 1, 3], seed=3)  # 11 > ring capacity 8: early rows dropped
    want, got = sc["window"].clone(), sc["window"].clone()
    write_window(sc["kv"], sc["batch"], want, sc["window_table"], backend="torch")
    write_window(sc["kv"], sc["batch"], got, sc["window_table"], backend="triton")
    assert torch.equal(got, want)
    ring = want[sc["window_table"][0].long()].reshape(8, D)
    assert torch.equal(ring[10 % 8], sc["kv"][10]) and torch.equal(ring[3], sc["kv"][3])


@pytest.mark.parametrize("topk", [2, 8])  # 8 > visible entries for early queries
@pytest.mark.parametrize(
    "starts, news",
    [([0, 30, 61], [5, 1, 7]), ([50], [13]), ([0, 30, 61], [2, 1, 3])],  # one sequence; every row at once
)
def test_indexer_topk_matches_twin_and_full_sort(topk, starts, news, device):
    gen = torch.Generator().manual_seed(4)
    batch = RaggedBatch.build(starts, news, device)
    t, hi, di = sum(news), 4, 8
    q, w = torch.randn(t, hi, di, generator=gen).to(device), torch.randn(t, hi, generator=gen).to(device)
    keys = torch.randn(40, BS, di, generator=gen).to(device)
    table = torch.randperm(40, generator=gen)[:15].view(3, 5)[: len(news)].to(torch.int32).to(device)
    visible = torch.div(batch.positions + 1, 4, rounding_mode="floor").to(torch.int32)
    got = indexer_topk(q, w, batch, keys, table, visible, topk, backend="triton", rows_max=5)  # several blocks
    longest = max((s + n) // 4 for s, n in zip(starts, news, strict=True))  # what the model passes, known on the host
    want = indexer_topk(q, w, batch, keys, table, visible, topk, backend="torch", rows_max=3, visible_max=longest)
    full = indexer_scores_torch(q, w, batch, keys, table, visible, 0, int(visible.max()))
    for row in range(t):
        expect = full[row].sort(descending=True, stable=True).indices[:topk]
        expect = sorted(e for e in expect.tolist() if e < visible[row])
        assert sorted(e for e in got[row].tolist() if e >= 0) == expect
        assert sorted(e for e in want[row].tolist() if e >= 0) == expect


def test_indexer_scores_a_row_at_a_time_as_in_one_piece(monkeypatch):
    """The torch twin's cache-sized pieces of rows (here one row each) change no selection."""
    from dayzero.kernels import indexer_torch

    gen = torch.Generator().manual_seed(12)
    batch = RaggedBatch.build([3, 40], [9, 6])
    q, w = torch.randn(15, 4, 8, generator=gen), torch.randn(15, 4, generator=gen)
    keys = torch.randn(30, BS, 8, generator=gen)
    table = torch.arange(30, dtype=torch.int32).view(2, 15)
    visible = torch.div(batch.positions + 1, 4, rounding_mode="floor").to(torch.int32)
    whole = indexer_topk(q, w, batch, keys, table, visible, 3)
    monkeypatch.setattr(indexer_torch, "HEADS_BUDGET", 1)
    assert torch.equal(indexer_topk(q, w, batch, keys, table, visible, 3), whole)


@pytest.mark.parametrize("rows", [4, 8])  # HCA-like (rate rows) and CSA-like (2 * rate rows)
def test_compressor_matches_twin(rows, device, tol):
    gen = torch.Generator().manual_seed(5)
    n, dim, rope = 5, 16, 8
    kv, gate = torch.randn(n, rows, dim, generator=gen), torch.randn(n, rows, dim, generator=gen)
    gate[0, : rows // 2] = float("-inf")  # the first window has no previous series
    norm = torch.randn(dim, generator=gen)
    angles = torch.randn(n, rope // 2, generator=gen)
    pool = torch.zeros(12, BS, dim)
    table = torch.tensor([[3, 7, 1], [0, 9, 11]], dtype=torch.int32)
    seq, entry = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([2, 5, 0, 4, 7])
    kv, gate, norm, angles, pool, table, seq, entry = (
        x.to(device) for x in (kv, gate, norm, angles, pool, table, seq, entry)
    )
    want, got = pool.clone(), pool.clone()
    args = (kv, gate, norm, angles.cos(), angles.sin(), 1e-6)
    compress_entries(*args, want, table, seq, entry, backend="torch")
    compress_entries(*args, got, table, seq, entry, backend="triton")
    assert (got - want).abs().max().item() < tol
    assert want[7, 5 % BS].abs().sum() > 0  # entry 5 of sequence 0 lands in block table[0][1]


@pytest.mark.parametrize("most", [18, 26])  # the busiest expert's rows; a looser bound (all rows): idle tiles
def test_grouped_mxfp4_matmul_matches_twin_with_empty_experts(device, most):
    from dayzero.kernels.moe import grouped_mxfp4_matmul
    from dayzero.quant.formats import quant_mxfp4

    gen = torch.Generator().manual_seed(6)
    packed, scales = quant_mxfp4(torch.randn(5, 40, 96, generator=gen))
    offsets = torch.tensor([0, 3, 3, 21, 21, 26], dtype=torch.int32)  # experts 1 and 3 get no tokens
    x = torch.randn(26, 96, generator=gen)
    packed, scales, offsets, x = (t.to(device) for t in (packed, scales, offsets, x))
    want = grouped_mxfp4_matmul(x, packed, scales, offsets, most, backend="torch")
    got = grouped_mxfp4_matmul(x, packed, scales, offsets, most, backend="triton")
    assert (got - want).abs().max().item() < (1e-4 if device == "cpu" else 3e-3) * want.abs().max().item()


@pytest.mark.parametrize(("n", "d"), [(4, 40), (2, 1030)])  # d not a power of two; d > one 1024 tile
def test_hyper_mix_matches_twin_and_is_doubly_stochastic(n, d, device, tol):
    from dayzero.kernels.hyper import hyper_mix

    gen = torch.Generator().manual_seed(7)
    t, width = 5, (2 + n) * n
    mixes, base = torch.randn(t, width, generator=gen), torch.randn(width, generator=gen)
    scale, streams = torch.rand(3, generator=gen) + 0.5, torch.randn(t, n, d, generator=gen)
    mixes, base, scale, streams = (x.to(device) for x in (mixes, base, scale, streams))
    want = hyper_mix(mixes, base, scale, streams, 20, 1e-6, backend="torch")
    got = hyper_mix(mixes, base, scale, streams, 20, 1e-6, backend="triton")
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max().item() < tol
    comb = got[2]
    assert (comb.sum(dim=-1) - 1).abs().max().item() < 1e-3  # Sinkhorn: rows and columns sum to one
    assert (comb.sum(dim=-2) - 1).abs().max().item() < 1e-5  # (the last pass normalised the columns)
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + 1e-6  # by hand: the collapse weights
    assert (got[0] - (pre[:, :, None] * streams).sum(1)).abs().max().item() < tol


@pytest.mark.parametrize(("n", "d"), [(4, 40), (2, 1030)])  # d not a power of two; d > one 1024 tile
def test_hyper_merge_matches_twin(n, d, device, tol):
    """The block's output spread by post onto the streams mixed by comb, one launch, against the
    twin and one element by hand: sum_i comb[t, i, j] * streams[t, i, e] + post[t, j] * out[t, e]."""
    from dayzero.kernels.hyper import hyper_merge, hyper_merge_torch

    gen = torch.Generator().manual_seed(8)
    t = 5
    streams, block_out = torch.randn(t, n, d, generator=gen), torch.randn(t, d, generator=gen)
    post, comb = torch.rand(t, n, generator=gen) * 2, torch.rand(t, n, n, generator=gen)
    args = [x.to(device) for x in (streams, block_out, post, comb)]
    got = hyper_merge(*args, backend="triton")
    assert got.shape == streams.shape and (got - hyper_merge_torch(*args)).abs().max().item() < tol
    by_hand = sum(comb[3, i, n - 1] * streams[3, i, d - 1] for i in range(n)) + post[3, n - 1] * block_out[3, d - 1]
    assert abs(got[3, n - 1, d - 1].item() - by_hand.item()) < 1e-5


@pytest.mark.parametrize("news", [[1, 1, 1, 1], [3, 2, 4, 8]])  # one scatter while no slot is taken twice
def test_window_write_of_a_decode_step_equals_the_spec(news, device):
    from dayzero.kernels.kv_write import write_window_torch

    sc = _scenario(device, starts=[0, 5, 37, 8], news=news, seed=9)  # slots 0, 5, 5 (wrapped), 0 onwards
    want, got = sc["window"].clone(), sc["window"].clone()
    write_window_torch(sc["kv"], sc["batch"], want, sc["window_table"])
    write_window(sc["kv"], sc["batch"], got, sc["window_table"], backend="torch")
    assert torch.equal(got, want)


def test_batched_indexer_scores_of_a_decode_step_equal_the_spec(device):
    from dayzero.kernels.indexer_torch import indexer_scores_decode_torch

    gen = torch.Generator().manual_seed(10)
    batch = RaggedBatch.build([3, 30, 61, 0], [1, 1, 1, 1], device)
    q, w = torch.randn(4, 4, 8, generator=gen).to(device), torch.randn(4, 4, generator=gen).to(device)
    keys = torch.randn(40, BS, 8, generator=gen).to(device)
    table = torch.randperm(40, generator=gen)[:20].view(4, 5).to(torch.int32).to(device)
    visible = torch.div(batch.positions + 1, 4, rounding_mode="floor").to(torch.int32)
    for first, count in ((0, 20), (3, 7), (16, 10)):  # whole, inside, past the end of the tables
        want = indexer_scores_torch(q, w, batch, keys, table, visible, first, count)
        got = indexer_scores_decode_torch(q, w, batch, keys, table, visible, first, count)
        assert torch.allclose(got, want, atol=1e-6), (first, count)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_splits_combine_as_the_twin(splits, device, tol):
    """The flash-decoding merge of the splits' partial softmaxes with the sink: a split with no keys
    (maximum -1e30, nothing summed) weighs nothing, and the padded heads are left out."""
    from dayzero.kernels.attention import combine_splits

    gen = torch.Generator().manual_seed(31)
    n_seq, heads, padded, dim = 2, 3, 16, 32
    m = torch.randn(n_seq, splits, padded, generator=gen) * 4
    l_sum = torch.rand(n_seq, splits, padded, generator=gen) * 10 + 0.5
    acc = torch.randn(n_seq, splits, padded, dim, generator=gen) * l_sum[..., None]
    if splits > 1:
        m[0, 1], l_sum[0, 1], acc[0, 1] = -1e30, 0.0, 0.0
    sink = torch.randn(heads, generator=gen)
    args = [t.to(device) for t in (m, l_sum, acc, sink)]
    want = combine_splits(*args, heads, torch.float32, backend="torch")
    got = combine_splits(*args, heads, torch.float32, backend="triton")
    assert got.shape == (n_seq, heads, dim) and (got - want).abs().max().item() < tol
    # by hand, one (sequence, head): sum_s e^(m_s - top) acc_s / (sum_s e^(m_s - top) l_s + e^(sink - top))
    top = torch.maximum(m[1, :, 2].max(), sink[2])
    w = torch.exp(m[1, :, 2] - top)
    by_hand = (w[:, None] * acc[1, :, 2]).sum(0) / ((w * l_sum[1, :, 2]).sum() + torch.exp(sink[2] - top))
    assert (got[1, 2].cpu() - by_hand).abs().max().item() < 1e-4
