"""The indexer's fast paths against fp32 torch maths: products in a bf16 cache's own type (AVX512-BF16
CPUs, GPUs), the head sums and a prefill block's scores as compiled CPU loops."""

from __future__ import annotations

import threading

import pytest
import torch

from dayzero.kernels import RaggedBatch, indexer_cpu, indexer_topk
from dayzero.kernels.indexer_torch import _product_type, indexer_scores_decode_torch, indexer_scores_torch

BS, HI, DI = 16, 8, 32


def _case(starts: list[int], news: list[int], blocks: int = 24):
    gen = torch.Generator().manual_seed(7)
    batch = RaggedBatch.build(starts, news)
    t = sum(news)
    q = torch.randn(t, HI, DI, generator=gen).bfloat16()
    w = torch.randn(t, HI, generator=gen).bfloat16()
    keys = torch.randn(blocks, BS, DI, generator=gen).bfloat16()
    table = torch.randperm(blocks, generator=gen)[: 8 * len(news)].view(len(news), 8).to(torch.int32)
    visible = torch.div(batch.positions + 1, 4, rounding_mode="floor").to(torch.int32)
    return q, w, batch, keys, table, visible


def _bound(q, w, batch, keys, table, visible, count):
    """2^-8 (bf16's unit roundoff) of sum_h |w_h| |q_h . k| Di^-0.5: each head's product rounded once."""
    q64, w64 = q.double(), w.double().abs()
    out = torch.zeros(q.shape[0], count, dtype=torch.float64)
    for s in range(batch.num_seqs):
        rows = batch.rows(s)
        pool = keys[table[s].long()].flatten(0, 1)[:count].double()
        out[rows] = torch.einsum("rh,rhn->rn", w64[rows], torch.einsum("rhd,nd->rhn", q64[rows], pool).abs())
    return out * DI**-0.5 * 2**-8 + 1e-6


def test_the_products_are_taken_in_bf16_where_the_cpu_has_it():
    want = torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() else torch.float32  # this CPU
    assert _product_type(torch.zeros(1, dtype=torch.bfloat16)) == want
    assert _product_type(torch.zeros(1)) == torch.float32


def test_bf16_decode_scores_stay_within_one_rounding_of_fp32():
    q, w, batch, keys, table, visible = _case([40, 70, 90], [1, 1, 1])
    count = int(visible.max())
    got = indexer_scores_decode_torch(q, w, batch, keys, table, visible, 0, count)
    want = indexer_scores_torch(q, w, batch, keys, table, visible, 0, count)  # fp32 products
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    err = (got.double() - want.double()).abs()[finite]
    assert bool((err <= _bound(q, w, batch, keys, table, visible, count)[finite]).all())


def test_bf16_selection_swaps_only_what_rounding_could():
    """An entry left out never beats a picked one in fp32 by more than their two roundings."""
    q, w, batch, keys, table, visible = _case([400, 0], [24, 30])  # prefill: blocks of rows per sequence
    topk, count = 20, int(visible.max())
    picked = indexer_topk(q, w, batch, keys, table, visible, topk)
    exact = indexer_scores_torch(q, w, batch, keys, table, visible, 0, count).double()
    bound = _bound(q, w, batch, keys, table, visible, count)
    for row in range(q.shape[0]):
        seen = int(visible[row])
        chosen = [e for e in picked[row].tolist() if e >= 0]
        assert len(chosen) == min(topk, seen)
        left = [e for e in range(seen) if e not in chosen]
        if chosen and left:
            worst_in = (exact[row, chosen] + bound[row, chosen]).min()
            best_out = (exact[row, left] - bound[row, left]).max()
            assert bool(worst_in >= best_out), row


def test_the_compiled_head_sum_equals_torchs():
    """sum_h w_h relu(s_h) from fp32 or bf16 scores (bf16 widened by its bits, exactly), against
    relu and a matvec in torch, to fp32's rounding of a 40-term sum of |w_h s_h| (either order)."""
    from dayzero.kernels.indexer_cpu import weighted_relu_rows

    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(40, generator=gen)
    for heads in (torch.randn(300, 40, generator=gen), torch.randn(300, 40, generator=gen).bfloat16()):
        heads[5] = -heads[5].abs()  # a row clipped whole
        wide = heads.float()
        want = torch.mv(wide.relu(), weights) * 0.25
        got = weighted_relu_rows(heads, weights, 0.25)
        bound = 40 * 2**-23 * torch.mv(wide.relu(), weights.abs()) * 0.25
        assert got.dtype == torch.float32 and got[5] == 0
        assert bool(((got - want).abs() <= bound).all())


def test_the_scores_are_fp32_whatever_torchs_default_dtype():
    """A prefill block's score buffer and the spec's scores are fp32 as documented, not torch's
    default dtype (a program that sets float64 had its buffer in float64: the head sum's fp32 out=
    refused it)."""
    q, w, batch, keys, table, visible = _case([400, 0], [24, 30])
    q, w, keys = q.float(), w.float(), keys.float()
    count = int(visible.max())
    want = indexer_topk(q, w, batch, keys, table, visible, 20)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        picked = indexer_topk(q, w, batch, keys, table, visible, 20)
        spec = indexer_scores_torch(q, w, batch, keys, table, visible, 0, count)
        decode = indexer_scores_decode_torch(
            q[:2], w[:2], RaggedBatch.build([40, 70], [1, 1]), keys, table, visible[:2], 0, 8
        )
    finally:
        torch.set_default_dtype(default)
    assert torch.equal(picked, want)
    assert spec.dtype == torch.float32 and decode.dtype == torch.float32


@pytest.mark.parametrize("heads, depth, threads", [(6, 16, 1), (3, 8, 1), (6, 16, 5)])  # 4 heads at a time and the rest
def test_the_compiled_block_scores_equal_the_spec(heads, depth, threads, monkeypatch):
    """A prefill block's scores by the compiled loop (16 entries a pass here: several passes, a row
    ending inside one; rows split among threads), against fp32 torch: -inf past each row's visible
    entries, and within fp32's rounding of the Di-term dots and the head sum (either order) elsewhere."""
    gen = torch.Generator().manual_seed(9)
    rows, n = 12, 70
    q, w = torch.randn(rows, heads, depth, generator=gen), torch.randn(rows, heads, generator=gen)
    keys = torch.randn(n, depth, generator=gen)
    visible = torch.tensor([0, 1, 15, 16, 17, 31, 33, 50, 64, 69, 70, 70], dtype=torch.int32)
    monkeypatch.setattr(indexer_cpu, "ENTRY_CHUNK_BYTES", 16 * 4 * depth)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    got = indexer_cpu.weighted_relu_scores(q, w, keys, visible, torch.full((rows, n), 7.0))
    dots = torch.einsum("rhd,nd->rhn", q.double(), keys.double())
    want = torch.einsum("rh,rhn->rn", w.double(), dots.relu()) * depth**-0.5
    bound = torch.einsum(
        "rh,rhn->rn", w.double().abs(), torch.einsum("rhd,nd->rhn", q.double().abs(), keys.double().abs())
    )
    hidden = torch.arange(n)[None, :] >= visible[:, None]
    assert bool(torch.isneginf(got[hidden]).all()) and bool(torch.isfinite(got[~hidden]).all())
    err = (got.double() - want).abs()[~hidden]
    assert bool((err <= (depth + heads + 2) * 2**-24 * bound[~hidden] * depth**-0.5 + 1e-30).all())


def test_a_prefill_block_with_a_small_di_takes_the_compiled_loop(monkeypatch):
    """fp32 keys of Di <= 16 on a CPU: the block is scored by the compiled loop (its picks are the
    spec's: test_kernels' full-sort test); a Di of 32 stays in torch."""
    from dayzero.kernels import indexer_torch

    calls = []
    compiled = indexer_cpu.weighted_relu_scores
    monkeypatch.setattr(indexer_torch, "weighted_relu_scores", lambda *a: calls.append(a[0].shape) or compiled(*a))
    for depth in (16, 32):
        gen = torch.Generator().manual_seed(depth)
        batch = RaggedBatch.build([40], [24])
        q, w = torch.randn(24, 4, depth, generator=gen), torch.randn(24, 4, generator=gen)
        keys = torch.randn(8, BS, depth, generator=gen)
        table = torch.arange(8, dtype=torch.int32)[None]
        visible = torch.div(batch.positions + 1, 4, rounding_mode="floor").to(torch.int32)
        indexer_topk(q, w, batch, keys, table, visible, 4)
    assert calls == [(24, 4, 16)]


def test_a_failure_in_a_helper_thread_reaches_the_caller(monkeypatch):
    """A block loop that fails on a helper thread's rows raises in the caller (and no helper still
    writes into the buffer after it returns) instead of leaving those rows' old scores."""
    compiled = indexer_cpu._block_kernel(8)

    def kernel(q, w, keys_t, visible, scale, out):
        if threading.current_thread() is not threading.main_thread():
            raise MemoryError("helper")
        return compiled(q, w, keys_t, visible, scale, out)

    monkeypatch.setattr(indexer_cpu, "_block_kernel", lambda depth: kernel)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    q, w, keys = torch.randn(6, 4, 8), torch.randn(6, 4), torch.randn(20, 8)
    with pytest.raises(MemoryError, match="helper"):
        indexer_cpu.weighted_relu_scores(q, w, keys, torch.full((6,), 20, dtype=torch.int32), torch.zeros(6, 20))


def test_a_stalled_thread_holds_up_only_the_rows_it_claimed(monkeypatch):
    """A thread the OS leaves waiting (here: a helper held in its first claim) holds up only that
    claim: the caller's thread scores every other row, and the scores are the bits of one thread
    scoring them all. (Rows split in fixed shares left the helper's half to it: the caller waited.)"""
    compiled = indexer_cpu._block_kernel(8)
    q, w, keys = torch.randn(64, 4, 8), torch.randn(64, 4), torch.randn(40, 8)
    visible = torch.arange(64, dtype=torch.int32) % 41
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    alone = indexer_cpu.weighted_relu_scores(q, w, keys, visible, torch.zeros(64, 40))
    held, by_caller, resumed = [], [], threading.Event()

    def kernel(q, w, keys_t, visible, scale, out):
        if threading.current_thread() is threading.main_thread():
            by_caller.append(len(q))
            if sum(by_caller) + sum(held) == 64:
                resumed.set()
        elif not held:
            held.append(len(q))
            resumed.wait(timeout=5)  # (fixed shares: never set, the test fails after this)
        return compiled(q, w, keys_t, visible, scale, out)

    monkeypatch.setattr(indexer_cpu, "_block_kernel", lambda depth: kernel)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    shared = indexer_cpu.weighted_relu_scores(q, w, keys, visible, torch.zeros(64, 40))
    assert resumed.is_set() and sum(by_caller) == 64 - held[0] and held[0] <= 4
    assert torch.equal(shared, alone)
