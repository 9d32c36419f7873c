"""Speculative decoding with the MTP layer: the same greedy output as plain decoding, its tokens and
their logprobs (drafts accepted, rejected, crossing window and compressor boundaries), and the
sampled distribution unchanged. The state a rejected draft wrote: test_speculative_rollback."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.completion import Completion, Step
from dayzero.demo import add_mtp, write_checkpoint
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.kv.handoff import export_state, import_state
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill
from dayzero.model.plan import AttentionOptions
from dayzero.params import MAX_LOGPROBS
from dayzero.sampling import SamplingParams
from dayzero.speculative import Acceptance, Speculation, speculative_step

from .conftest import random_ids, tiny_config
from .speculative_cases import GREEDY, TOKENS, completion_of, first_right_drafts, oracle_drafts, prompts_of

SCORED = replace(GREEDY, logprobs=MAX_LOGPROBS)  # each step's logprob and top alternatives, from its logits
# fp32 on the CPU, the same maths as plain decoding in another summation order (a verify's k + 1
# rows at once, the kernels beside their torch twins): measured <= 1e-6 (2 ulp of a logprob near -4.6).
# A state error shows far above it: a window row written a slot off, a step's own rows read without
# its batch offset, a kept draft's row left uncommitted moved logprobs by 0.02-0.06, every argmax kept.
LOGPROB_TOL = 1e-4


def _assert_plain(steps: list[list[Step]], run: tuple[list[list[int]], torch.Tensor], count: int = TOKENS) -> None:
    """Each sequence's steps are the first ``count`` of plain greedy decoding's ``run``: its tokens,
    and each token's logprob and top alternatives' within LOGPROB_TOL (read at the ids the step
    reports: near ties may order them either way), the alternatives' values plain's top values."""
    tokens, logprobs = run
    assert [[s.token for s in row] for row in steps] == [t[:count] for t in tokens[: len(steps)]]
    ids = torch.tensor([[[s.token, *(t for t, _ in s.top)] for s in row] for row in steps])  # [B, count, 1 + top]
    got = torch.tensor([[[s.logprob, *(v for _, v in s.top)] for s in row] for row in steps])
    expected = logprobs[: len(steps), :count].gather(2, ids)
    torch.testing.assert_close(got, expected, atol=LOGPROB_TOL, rtol=0)
    top = got[..., 1:].sort(-1, descending=True).values  # the alternatives are plain's best, whatever their ties' order
    torch.testing.assert_close(top, logprobs[: len(steps), :count].topk(top.shape[-1]).values, atol=LOGPROB_TOL, rtol=0)


def _speculate(model, prompts, spec, params=SCORED, pools=None, options=AttentionOptions(), prefill_options=None):
    """Prefill (with ``prefill_options``, else ``options``), then speculative steps until every
    completion ends -> (steps, acceptance, pools)."""
    ids = [f"s{i}" for i in range(len(prompts))]
    pools = pools or pools_for(model.cfg, torch.float32, 64, max_sequences=len(prompts), mtp=True)
    completions = [completion_of(p, params) for p in prompts]
    logits = prefill(model, pools, ids, prompts, prefill_options or options)
    out = [[c.next(row)] for c, row in zip(completions, logits, strict=True)]
    acceptance = Acceptance()
    while any(c.count < params.max_tokens for c in completions):
        live = [i for i, c in enumerate(completions) if c.count < params.max_tokens]
        pending, chosen = [out[i][-1].token for i in live], [completions[i] for i in live]
        outcomes = speculative_step(model, pools, [ids[i] for i in live], pending, chosen, spec, options)
        for i, outcome in zip(live, outcomes, strict=True):
            out[i] += outcome.steps
            acceptance.add(outcome)
    return out, acceptance, pools


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("k", [1, 2])
def test_greedy_equals_plain_decoding(mtp_model, plain_greedy, batch, k):
    """The MTP layer's own drafts (random weights: some accepted, most not)."""
    steps, acceptance, _ = _speculate(mtp_model, prompts_of(mtp_model, batch), Speculation(k))
    _assert_plain(steps, plain_greedy[batch])
    assert acceptance.steps and sum(acceptance.drafted) > 0


@pytest.mark.slow
def test_greedy_equals_plain_decoding_on_the_triton_kernels(mtp_model, plain_greedy):
    """The Triton kernels (interpreted here, compiled on a GPU) under speculation emit plain greedy
    decoding's tokens and logprobs (the torch twins', which the kernels' plain decode equals:
    test_forward): the drafts, the verify's few rows per sequence through the prefill kernel and the
    window-write kernel, the compressors folded a column of rows at a time, the commit of a kept
    draft's row, the rollback. The prompts are prefilled by the twins (the kernels' prefill: test_forward, the pools
    the same layout), the steps after it run on the kernels.
    Each step's first draft is the true token and its second not (5 tokens in 2 steps): each
    sequence (prompts 13 and 5) has the row that completes a block of both compressors (15, 7)
    verified and rolled back, then commits it; the longer one's second verify wraps its window ring."""
    prompts, tokens = prompts_of(mtp_model, 2), 5
    pools = pools_for(mtp_model.cfg, torch.float32, 64, max_sequences=2, mtp=True)
    spec = Speculation(2, first_right_drafts(plain_greedy[8][0], prompts, pools))
    params, options = replace(SCORED, max_tokens=tokens), AttentionOptions(backend="triton")
    steps, acceptance, _ = _speculate(mtp_model, prompts, spec, params, pools, options, AttentionOptions())
    _assert_plain(steps, plain_greedy[8], tokens)
    assert acceptance.drafted == [4, 2] and acceptance.accepted == [4, 0]  # the last step has room for one draft


@pytest.mark.parametrize("wrong", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_forced_acceptance_and_rejection(mtp_model, plain_greedy, k, wrong):
    """Drafts replaced by the true continuation (runs of k accepted every step) or by wrong tokens
    (every draft rejected): the output is the same either way."""
    prompts = prompts_of(mtp_model, 8)
    pools = pools_for(mtp_model.cfg, torch.float32, 64, max_sequences=8, mtp=True)
    spec = Speculation(k, oracle_drafts(plain_greedy[8][0], prompts, pools, wrong))
    steps, acceptance, _ = _speculate(mtp_model, prompts, spec, pools=pools)
    _assert_plain(steps, plain_greedy[8])
    assert sum(acceptance.accepted) == (0 if wrong else sum(acceptance.drafted))
    if not wrong:  # k + 1 tokens per step until the budget runs short
        assert acceptance.emitted / acceptance.steps > k


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """16 tokens: a first-token histogram over many seeds resolves every probability."""
    out = write_checkpoint(tmp_path_factory.mktemp("vocab16"), tiny_config(vocab_size=16), seed=3)
    add_mtp(out, seed=3)
    return load_model(out, progress=False)


SAMPLES = 400
TEMPERATURE = 0.05  # the tiny random model's logits are flat: peak them, so q and p differ clearly


def _tv_bound(p: torch.Tensor, n: int) -> float:
    """Total variation of ``n`` draws from ``p`` to ``p``: E[TV] <= 1/2 sum sqrt(p (1 - p) / n), and
    TV changes by at most 1/n per draw, so P(TV > E[TV] + 0.1) <= exp(-2 n 0.1^2) = 3e-4 at n = 400."""
    return 0.5 * (p * (1 - p) / n).sqrt().sum().item() + 0.1


@pytest.mark.parametrize("k", [1, 2])
def test_sampling_distribution_is_unchanged(small_vocab, k):
    """One seed per sequence: the first token a speculative step emits follows the model's own
    next-token distribution p (rejection sampling against the MTP's q), within a total-variation
    bound, though the drafts follow q, which is beyond that bound from p."""
    model, prompt, first = small_vocab, random_ids(11, 16, seed=8), 5
    params = SamplingParams(max_tokens=8, temperature=TEMPERATURE, ignore_eos=True)
    pools = pools_for(model.cfg, torch.float32, 16, max_sequences=SAMPLES + 1, mtp=True)
    target = (prefill(model, pools, ["p"], [prompt + [first]])[0] / TEMPERATURE).softmax(-1)
    counts = torch.zeros(16)
    drafted = torch.zeros(16)
    ids = [f"s{i}" for i in range(SAMPLES)]
    prefill(model, pools, ids[:1], [prompt])
    for seq in ids[1:]:
        import_state(pools, pools, export_state(pools, ids[0]), seq)
    completions = []
    for i in range(SAMPLES):
        c = completion_of(prompt, replace(params, seed=i))
        c.accept(first)
        completions.append(c)

    def record(seq_ids, drafts):
        for d in drafts:
            drafted[d[0]] += 1
        return drafts

    for outcome in speculative_step(model, pools, ids, [first] * SAMPLES, completions, Speculation(k, record)):
        counts[outcome.steps[0].token] += 1
    bound = _tv_bound(target, SAMPLES)
    assert 0.5 * (counts / SAMPLES - target).abs().sum() < bound
    assert 0.5 * (drafted / SAMPLES - target).abs().sum() > bound  # taking the drafts would fail


@pytest.mark.parametrize("stop_at", [4, 5])
def test_eos_inside_an_accepted_run_ends_there(mtp_model, plain_tokens, stop_at):
    """Runs of k = 2 accepted drafts: an EOS that arrives as the first or the second token of a run
    ends the completion on it; no token after it is emitted."""
    prompts, ref = prompts_of(mtp_model, 1), plain_tokens[1][0]
    eos = ref[stop_at]
    end = ref.index(eos)
    pools = pools_for(mtp_model.cfg, torch.float32, 64, mtp=True)
    spec = Speculation(2, oracle_drafts(plain_tokens[1], prompts, pools, wrong=False))
    completion = Completion(IdsOnlyCodec(), replace(GREEDY, ignore_eos=False), (eos,), len(prompts[0]), 1 << 20)
    steps = [completion.next(prefill(mtp_model, pools, ["s0"], prompts)[0])]
    while not steps[-1].finish_reason:
        steps += speculative_step(mtp_model, pools, ["s0"], [steps[-1].token], [completion], spec)[0].steps
    assert [s.token for s in steps] == ref[: end + 1]
    assert steps[-1].finish_reason == "stop" and completion.count == end + 1


@pytest.mark.parametrize("k", [1, 2])
def test_the_trained_models_drafts_are_accepted_and_change_nothing(k):
    """On the shipped trained model the MTP layer's drafts are right often enough to be kept (its
    t+2 guess is right ~30% of the time on held-out text), and greedy output is plain decoding's:
    the tokens, and each one's logprob within LOGPROB_TOL."""
    from dayzero.engine import Timings, generate
    from dayzero.settings import BUILT_IN_MODEL
    from dayzero.tokenizer import load_codec

    model, codec = load_model(BUILT_IN_MODEL, progress=False), load_codec(BUILT_IN_MODEL)
    prompt = codec.encode('The "if" statement is used for')
    params = SamplingParams(max_tokens=48, ignore_eos=True, logprobs=0)

    def run(speculation: Speculation | None) -> tuple[list[Step], Timings]:
        timings = Timings()
        pools = pools_for(model.cfg, torch.float32, 128, mtp=speculation is not None)
        return list(generate(model, codec, pools, prompt, params, timings, speculation=speculation)), timings

    plain, _ = run(None)
    fast, timings = run(Speculation(k))
    assert [s.token for s in fast] == [s.token for s in plain]
    logprobs = torch.tensor([[s.logprob for s in fast], [s.logprob for s in plain]])
    torch.testing.assert_close(logprobs[0], logprobs[1], atol=LOGPROB_TOL, rtol=0)
    assert timings.summary()["mean_accepted_length"] > 1.05  # drafts were kept, not only made
