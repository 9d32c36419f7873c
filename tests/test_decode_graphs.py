"""Decode steps of a fixed shape (``Bucket``), replayed from one captured step (``DecodeGraphs``),
equal each sequence's own full forward.

On a GPU the runner captures CUDA graphs; on a CPU it re-runs the forward on the captured plan
(host values frozen at capture, tensors refreshed: a replay's semantics), so a step that read a
host value of its own (a length, a closing window) would go wrong here too."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill, score
from dayzero.model.graphs import PAD, DecodeGraphs
from dayzero.model.plan import AttentionOptions, Bucket, plan_step

from .conftest import random_ids

TRITON = AttentionOptions(backend="triton")


def test_replayed_steps_equal_each_sequences_full_forward(tiny_checkpoint, device, tol):
    """Three sequences (a padding row in a bucket of 4) at different phases of their windows (CSA 4,
    HCA 8), five steps: windows close at different rows, the longest crosses the 64-token bucket
    into the 128 one, then a sequence leaves (a bucket of 2)."""
    model = load_model(tiny_checkpoint, device=device, progress=False)
    vocab, ids = model.cfg.vocab_size, ["a", "b", "c"]
    prompts = [random_ids(n, vocab, seed=50 + n) for n in (5, 30, 61)]
    follow = [random_ids(5, vocab, seed=60 + i) for i in range(3)]
    full = [
        score(model, pools_for(model.cfg, torch.float32, 70, device=device), "f", p + f)
        for p, f in zip(prompts, follow, strict=True)
    ]
    pools = pools_for(model.cfg, torch.float32, 70, max_sequences=4, device=device)  # 3 + the pad
    prefill(model, pools, ids, prompts)
    pools.reserve("b", 70)  # blocks reserved ahead, as decode admission does: past the 64-token bucket's tables
    graphs = DecodeGraphs(model, pools, TRITON, least_tokens=64)
    errors = []
    for step in range(5):
        rows = [0, 1, 2] if step < 4 else [1, 2]
        logits = graphs.decode([ids[r] for r in rows], [follow[r][step] for r in rows])
        for row, r in enumerate(rows):
            want = full[r][len(prompts[r]) + step]
            errors.append((logits[row] - want).abs().max().item())
    assert [pools.length(s) for s in ids] == [9, 35, 66]
    assert set(graphs._steps) == {Bucket(4, 64, PAD), Bucket(4, 128, PAD), Bucket(2, 128, PAD)}
    assert max(errors) < (tol if device == "cpu" else 10 * tol)  # as the eager triton steps: TF32 over the layers


def test_a_bucket_plans_only_steps_that_fit_it(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    pools = pools_for(model.cfg, torch.float32, 70, max_sequences=3)
    prefill(model, pools, ["a", "b"], [random_ids(20, model.cfg.vocab_size, seed=1)] * 2)
    bucket = Bucket(2, 64, PAD)
    with pytest.raises(ValueError, match="pad"):  # the pad sequence must exist, with a block of every pool
        pools.reserve(PAD, 1)
        plan_step(model.cfg, pools, ["a"], [20], [[1]], TRITON, bucket)
    pools.reserve(PAD, 8)
    plan_step(model.cfg, pools, ["a", "b"], [20, 20], [[1], [2]], TRITON, bucket)
    with pytest.raises(ValueError, match="triton"):
        plan_step(model.cfg, pools, ["a"], [20], [[1]], AttentionOptions(), bucket)
    with pytest.raises(ValueError, match="up to 1 sequences"):
        plan_step(model.cfg, pools, ["a", "b"], [20, 20], [[1], [2]], TRITON, Bucket(1, 64, PAD))
    with pytest.raises(ValueError, match="decode steps"):
        plan_step(model.cfg, pools, ["a"], [20], [[1, 2]], TRITON, bucket)
    with pytest.raises(ValueError, match="longer than the bucket"):
        plan_step(model.cfg, pools, ["a"], [20], [[1]], TRITON, Bucket(2, 16, PAD))


def test_buckets_are_powers_of_two():
    assert Bucket.fitting(3, 65, PAD, least_tokens=64) == Bucket(4, 128, PAD)
    assert Bucket.fitting(1, 5, PAD) == Bucket(1, 1024, PAD)
    assert Bucket.fitting(32, 4096, PAD) == Bucket(32, 4096, PAD)


def test_a_worker_with_decode_graphs_decodes_through_them(tiny_checkpoint):
    """``DAYZERO_DECODE_GRAPHS``' wiring: a worker's decode steps go through its buckets, equal to
    the eager steps (Triton backend both)."""
    from dayzero.parallel.collectives import Group
    from dayzero.serving.ranks import Ranks

    model = load_model(tiny_checkpoint, progress=False)
    prompt = random_ids(12, model.cfg.vocab_size, seed=70)
    logits = []
    for graphs in (False, True):
        pools = pools_for(model.cfg, torch.float32, 40, max_sequences=2)
        ranks = Ranks(Group(), model, pools, TRITON, decode_graphs=graphs)
        prefill(model, pools, ["s"], [prompt])
        logits.append(ranks.decode(["s"], [5]))
        assert (ranks.graphs is not None) == graphs and pools.length("s") == 13
    assert set(ranks.graphs._steps) == {Bucket(1, 1024, PAD)}
    assert (logits[0] - logits[1]).abs().max().item() < 1e-5


def test_a_warm_up_captures_every_batch_sizes_shortest_bucket(tiny_checkpoint):
    """A batch of 3 after ``capture_batches(5)`` (the warm-up's, DAYZERO_MAX_BATCH 5) finds its
    bucket captured: buckets of 1, 2, 4 and 8 rows (5 rounds up to 8), none longer."""
    model = load_model(tiny_checkpoint, progress=False)
    pools = pools_for(model.cfg, torch.float32, 40, max_sequences=4)
    graphs = DecodeGraphs(model, pools, TRITON)
    graphs.capture_batches(5)
    captured = {Bucket(n, 1024, PAD) for n in (1, 2, 4, 8)}
    assert set(graphs._steps) == captured
    for s in "abc":
        prefill(model, pools, [s], [random_ids(6, model.cfg.vocab_size, seed=ord(s))])
    graphs.decode(list("abc"), [1, 2, 3])
    assert set(graphs._steps) == captured
