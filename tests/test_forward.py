"""Incremental decoding and chunked prefill equal one full forward over the same tokens."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill, reserve_plan, score
from dayzero.model.plan import AttentionOptions

from .conftest import random_ids

# Same weights, same fp32 maths, only the split into steps differs: rounding-level agreement.
TOL = 1e-5


def _full(model, ids, options=AttentionOptions(), device="cpu"):
    return score(model, pools_for(model.cfg, torch.float32, len(ids), device=device), "full", ids, options)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_decode_steps_equal_full_forward(tiny_checkpoint, backend, device, tol):
    """On a GPU host the Triton backend is compiled (it takes device tensors) and dots in TF32."""
    device = device if backend == "triton" else "cpu"
    model = load_model(tiny_checkpoint, device=device, progress=False)
    options = AttentionOptions(backend=backend)
    # interpreted kernels are slow: 12 steps (positions 22..33), the fewest that close blocks of both
    # compressors (CSA 4, HCA 8) twice, a step reading what a step closed, and wrap the window's ring
    # of one 16-row block: position 32 goes to slot 0, which step 33 reads (a step attends to its own
    # row before writing it, so the wrapping write shows only in the next step)
    n = 90 if backend == "torch" else 35
    ids = random_ids(n, model.cfg.vocab_size, seed=5)
    full = _full(model, ids, device=device)
    pools = pools_for(model.cfg, torch.float32, n, device=device)
    first = prefill(model, pools, ["s"], [ids[:22]], options)[0]  # 22: mid-window of every compressor
    errors = [(first - full[21]).abs().max().item()]
    for t in range(22, n - 1):  # decode steps crossing CSA (4) and HCA (8) boundaries
        logits = decode(model, pools, ["s"], [ids[t]], options)[0]
        errors.append((logits - full[t]).abs().max().item())
    assert pools.length("s") == n - 1
    assert max(errors) < (TOL if device == "cpu" else 10 * tol)


def test_chunked_prefill_equals_full_forward(tiny_checkpoint):
    model = load_model(tiny_checkpoint, progress=False)
    ids = random_ids(64, model.cfg.vocab_size, seed=6)
    full = _full(model, ids)
    for chunk in (1, 3, 7, 16):
        pools = pools_for(model.cfg, torch.float32, 64)
        got = prefill(model, pools, ["s"], [ids], chunk_size=chunk)[0]
        assert (got - full[-1]).abs().max().item() < TOL


def test_batched_decode_keeps_sequences_apart(tiny_checkpoint):
    """Sequences at different phases of their compressor windows (CSA 4, HCA 8; one closes its first),
    decoded together for 10 steps, each step equal to that sequence's own full forward."""
    model = load_model(tiny_checkpoint, progress=False)
    prompts = [random_ids(n, model.cfg.vocab_size, seed=7 + n) for n in (30, 11, 2)]
    follow = [random_ids(10, model.cfg.vocab_size, seed=20 + i) for i in range(3)]
    pools = pools_for(model.cfg, torch.float32, 41, max_sequences=3)
    prefill(model, pools, ["a", "b", "c"], prompts)
    for step in range(10):
        batched = decode(model, pools, ["a", "b", "c"], [f[step] for f in follow])
        for row, (ids, more) in enumerate(zip(prompts, follow, strict=True)):
            alone = _full(model, [*ids, *more[: step + 1]])[-1]
            assert (batched[row] - alone).abs().max().item() < TOL, (step, row)


def test_steps_of_a_few_tokens_per_sequence_keep_sequences_apart(tiny_checkpoint):
    """A speculative verify's shape: several sequences feeding 1-3 tokens each in one step (every
    row attended at once, the compressors folded a column of rows at a time), 6 steps crossing
    window boundaries at different rows; each sequence's last logits equal its own full forward."""
    model = load_model(tiny_checkpoint, progress=False)
    prompts = [random_ids(n, model.cfg.vocab_size, seed=40 + n) for n in (30, 11, 2)]
    pools = pools_for(model.cfg, torch.float32, 50, max_sequences=3)
    prefill(model, pools, ["a", "b", "c"], prompts)
    seen = [list(p) for p in prompts]
    for step in range(6):
        news = [(step + row) % 3 + 1 for row in range(3)]
        chunks = [random_ids(n, model.cfg.vocab_size, seed=60 + 3 * step + row) for row, n in enumerate(news)]
        batched = prefill(model, pools, ["a", "b", "c"], chunks)
        for row, chunk in enumerate(chunks):
            seen[row] += chunk
            alone = _full(model, seen[row])[-1]
            assert (batched[row] - alone).abs().max().item() < TOL, (step, row)


def test_sparse_selection_switch(tiny_checkpoint):
    """Selection off: CSA layers read every causal entry; the logits move, the state stays usable."""
    model = load_model(tiny_checkpoint, progress=False)
    ids = random_ids(60, model.cfg.vocab_size, seed=9)
    sparse = _full(model, ids)
    dense = _full(model, ids, AttentionOptions(sparse=False))
    assert (sparse - dense).abs().max().item() > 1e-3  # top-k (3) < 15 entries: selection matters
    cfg_all = model.cfg.__class__.from_dict({**model.cfg.raw, "index_topk": 1000})
    model.cfg = cfg_all  # top-k covering every entry selects exactly what dense mode reads
    assert (_full(model, ids) - dense).abs().max().item() < TOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (compiled Triton kernels)")
def test_compiled_kernels_match_the_twins_in_the_model(tiny_checkpoint, tol):
    model = load_model(tiny_checkpoint, device="cuda", progress=False)
    ids = random_ids(70, model.cfg.vocab_size, seed=15)
    outputs = {}
    for backend in ("torch", "triton"):
        pools = pools_for(model.cfg, torch.float32, 80, device="cuda")
        options = AttentionOptions(backend=backend)
        logits = [prefill(model, pools, ["s"], [ids[:50]], options)[0]]
        logits += [decode(model, pools, ["s"], [t], options)[0] for t in ids[50:]]
        outputs[backend] = torch.stack(logits)
    assert (outputs["triton"] - outputs["torch"]).abs().max().item() < 10 * tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (compiled Triton kernels)")
def test_compiled_kernels_follow_the_twins_in_bfloat16(tiny_checkpoint):
    """The serving dtype on GPUs: kernels load bf16 and compute in fp32, the twins round more often,
    so the two agree in direction (cosine), not to the last bit."""
    model = load_model(tiny_checkpoint, torch.bfloat16, device="cuda", progress=False)
    ids = random_ids(70, model.cfg.vocab_size, seed=16)
    outputs = {}
    for backend in ("torch", "triton"):
        pools = pools_for(model.cfg, torch.bfloat16, 80, device="cuda")
        options = AttentionOptions(backend=backend)
        logits = [prefill(model, pools, ["s"], [ids[:50]], options)[0]]
        logits += [decode(model, pools, ["s"], [t], options)[0] for t in ids[50:]]
        outputs[backend] = torch.stack(logits)
    cosine = torch.nn.functional.cosine_similarity(outputs["triton"], outputs["torch"], dim=-1)
    assert cosine.min().item() > 0.99


def test_prompt_logprobs_equal_the_full_forwards_log_softmax_across_chunks(tiny_checkpoint):
    from dayzero.sampling import PromptLogprobs

    model = load_model(tiny_checkpoint, progress=False)
    ids, other = random_ids(30, model.cfg.vocab_size, seed=11), random_ids(12, model.cfg.vocab_size, seed=12)
    want = torch.log_softmax(_full(model, ids), dim=-1)[:-1]  # row t predicts token t + 1
    pools = pools_for(model.cfg, torch.float32, 30, max_sequences=2)
    scores = {0: PromptLogprobs(top=3)}  # the second prompt asks for none
    prefill(model, pools, ["a", "b"], [ids, other], chunk_size=7, prompt_logprobs=scores)
    got = scores[0].scores
    assert len(got) == len(ids) - 1
    assert max(abs(lp - want[t, ids[t + 1]].item()) for t, (lp, _) in enumerate(got)) < TOL
    assert [[tok for tok, _ in top] for _, top in got] == want.topk(3).indices.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (stream synchronisation)")
def test_planning_a_decode_step_does_not_wait_for_the_device(tiny_checkpoint):
    """A step's metadata goes to the GPU while the device may still run the last step: no copy or
    read in the plan may make the host wait (each did: a copy from pageable memory synchronises)."""
    model = load_model(tiny_checkpoint, torch.bfloat16, device="cuda", progress=False)
    ids = random_ids(40, model.cfg.vocab_size, seed=17)
    pools = pools_for(model.cfg, torch.bfloat16, 80, 2, device="cuda")
    for backend in ("torch", "triton"):
        options = AttentionOptions(backend=backend)
        seqs = [f"{backend}0", f"{backend}1"]
        prefill(model, pools, seqs, [ids[:30], ids[:37]], options)
        torch.cuda.set_sync_debug_mode("error")
        try:
            reserve_plan(model, pools, seqs, [[ids[30]], [ids[37]]], options)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_a_prompt_prefilled_over_several_calls_leaves_the_mtp_state_of_one_call(mtp_checkpoint):
    """Each call kept its last position's streams for the MTP layer with no token after them, and the
    next call never fed them: the MTP window lacked that row (its drafts read a stale one)."""
    model = load_model(mtp_checkpoint, progress=False)
    prompt = random_ids(20, model.cfg.vocab_size, seed=9)
    whole = pools_for(model.cfg, torch.float32, 64, mtp=True)
    prefill(model, whole, ["s"], [prompt])
    parts = pools_for(model.cfg, torch.float32, 64, mtp=True)
    for begin, end in ((0, 9), (9, 16), (16, 20)):  # a call ends at 15, inside the last window (8)
        prefill(model, parts, ["s"], [prompt[begin:end]])

    def mtp_window(pools) -> torch.Tensor:
        """The MTP layer's rows of the last window (it lags the main model by one position)."""
        table, bs = pools.sequences["s"].tables["window"], pools.layout.block_size
        slots = [p % (len(table) * bs) for p in range(20 - pools.layout.sliding_window, 19)]
        return pools.window[model.cfg.num_layers, [table[s // bs] for s in slots], [s % bs for s in slots]]

    assert torch.allclose(mtp_window(parts), mtp_window(whole), atol=1e-5)
    assert torch.allclose(parts.hidden(["s"], torch.float32), whole.hidden(["s"], torch.float32), atol=1e-5)
