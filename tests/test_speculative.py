"""Speculative decoding with the MTP layer: the same greedy output as plain decoding (drafts
accepted, rejected, crossing window and compressor boundaries), every kind of state rolled
back, and the sampled distribution unchanged."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.completion import Completion
from dayzero.kv.pools import KVPools, pools_for
from dayzero.model.forward import decode, prefill
from dayzero.sampling import SamplingParams
from dayzero.speculative import Acceptance, Speculation, speculative_step
from dayzero.tokenizer import IdsOnlyCodec

from .conftest import random_ids

LENGTHS = (13, 5, 22, 9, 30, 2, 17, 11)  # different phases of the window (8) and compressors (4, 8)
TOKENS = 24
GREEDY = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
STATE_TOL = 1e-5  # the same rows computed by the prefill and decode kernels: rounding-level


@pytest.fixture(scope="module")
def model(mtp_checkpoint):
    return load_model(mtp_checkpoint, progress=False)


def _prompts(model, batch: int) -> list[list[int]]:
    return [random_ids(n, model.cfg.vocab_size, seed=40 + i) for i, n in enumerate(LENGTHS[:batch])]


def _greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    """Plain batched greedy decoding: TOKENS tokens per prompt."""
    ids = [f"s{i}" for i in range(len(prompts))]
    pools = pools_for(model.cfg, torch.float32, 64, max_sequences=len(prompts))
    out = [[int(t)] for t in prefill(model, pools, ids, prompts).argmax(-1)]
    for _ in range(TOKENS - 1):
        for row, t in zip(out, decode(model, pools, ids, [r[-1] for r in out]).argmax(-1), strict=True):
            row.append(int(t))
    return out


@pytest.fixture(scope="module")
def references(model):
    return {batch: _greedy(model, _prompts(model, batch)) for batch in (1, 8)}


def _completion(prompt: list[int], params: SamplingParams) -> Completion:
    return Completion(IdsOnlyCodec(), params, (), len(prompt), 1 << 20)


def _speculate(model, prompts, spec, params=GREEDY, pools=None):
    """Prefill, then speculative steps until every completion ends -> (tokens, acceptance, pools)."""
    ids = [f"s{i}" for i in range(len(prompts))]
    pools = pools or pools_for(model.cfg, torch.float32, 64, max_sequences=len(prompts), mtp=True)
    completions = [_completion(p, params) for p in prompts]
    out = [[c.next(row).token] for c, row in zip(completions, prefill(model, pools, ids, prompts), strict=True)]
    acceptance = Acceptance()
    while any(c.count < params.max_tokens for c in completions):
        live = [i for i, c in enumerate(completions) if c.count < params.max_tokens]
        outcomes = speculative_step(
            model, pools, [ids[i] for i in live], [out[i][-1] for i in live], [completions[i] for i in live], spec
        )
        for i, outcome in zip(live, outcomes, strict=True):
            out[i] += [s.token for s in outcome.steps]
            acceptance.add(outcome)
    return out, acceptance, pools


def _oracle(references, prompts, pools: KVPools, wrong: bool):
    """Drafts that are the true greedy continuation (always accepted) or never it (always rejected)."""

    def propose(seq_ids: list[str], drafts: list[list[int]]) -> list[list[int]]:
        out = []
        for seq, d in zip(seq_ids, drafts, strict=True):
            i = int(seq[1:])
            done = pools.length(seq) - len(prompts[i]) + 1  # tokens emitted so far
            true = references[i][done : done + len(d)]
            out.append([(t + 1) % 96 for t in true] if wrong else true)
        return out

    return propose


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("k", [1, 2])
def test_greedy_equals_plain_decoding(model, references, batch, k):
    """The MTP layer's own drafts (random weights: some accepted, most not)."""
    out, acceptance, _ = _speculate(model, _prompts(model, batch), Speculation(k))
    assert out == references[batch]
    assert acceptance.steps and sum(acceptance.drafted) > 0


@pytest.mark.parametrize("wrong", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_forced_acceptance_and_rejection(model, references, k, wrong):
    """Drafts replaced by the true continuation (runs of k accepted every step) or by wrong tokens
    (every draft rejected): the output is the same either way."""
    prompts = _prompts(model, 8)
    pools = pools_for(model.cfg, torch.float32, 64, max_sequences=8, mtp=True)
    spec = Speculation(k, _oracle(references[8], prompts, pools, wrong))
    out, acceptance, _ = _speculate(model, prompts, spec, pools=pools)
    assert out == references[8]
    assert sum(acceptance.accepted) == (0 if wrong else sum(acceptance.drafted))
    if not wrong:  # k + 1 tokens per step until the budget runs short
        assert acceptance.emitted / acceptance.steps > k
