"""The cases the speculative-decoding tests share (test_speculative, test_speculative_rollback): the
tiny MTP model, its prompts, plain greedy decoding's output, and drafts forced right or wrong. A plugin
(tests/conftest.py's ``pytest_plugins``): its fixtures reach both modules without an import to shadow."""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.completion import Completion
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.kv.pools import KVPools, pools_for
from dayzero.model.forward import decode, prefill
from dayzero.sampling import SamplingParams

from .conftest import random_ids

LENGTHS = (13, 5, 22, 9, 30, 2, 17, 11)  # different phases of the window (8) and compressors (4, 8)
TOKENS = 24
GREEDY = SamplingParams(max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def mtp_model(mtp_checkpoint):
    return load_model(mtp_checkpoint, progress=False)


def prompts_of(model, batch: int) -> list[list[int]]:
    return [random_ids(n, model.cfg.vocab_size, seed=40 + i) for i, n in enumerate(LENGTHS[:batch])]


def _greedy(model, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """Plain batched greedy decoding: TOKENS tokens per prompt, and the log-probabilities each
    was chosen from [B, TOKENS, V]."""
    ids = [f"s{i}" for i in range(len(prompts))]
    pools = pools_for(model.cfg, torch.float32, 64, max_sequences=len(prompts))
    logits = [prefill(model, pools, ids, prompts)]
    for _ in range(TOKENS - 1):
        logits.append(decode(model, pools, ids, logits[-1].argmax(-1).tolist()))
    steps = torch.stack(logits, dim=1)  # [B, TOKENS, V]
    return steps.argmax(-1).tolist(), steps.log_softmax(-1)


@pytest.fixture(scope="module")
def plain_greedy(mtp_model):
    """Batch size -> plain greedy decoding's tokens and logprobs."""
    return {batch: _greedy(mtp_model, prompts_of(mtp_model, batch)) for batch in (1, 8)}


@pytest.fixture(scope="module")
def plain_tokens(plain_greedy):
    """Batch size -> plain greedy decoding's tokens."""
    return {batch: tokens for batch, (tokens, _) in plain_greedy.items()}


def completion_of(prompt: list[int], params: SamplingParams) -> Completion:
    return Completion(IdsOnlyCodec(), params, (), len(prompt), 1 << 20)


def oracle_drafts(references, prompts, pools: KVPools, wrong: bool):
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


def first_right_drafts(references, prompts, pools: KVPools):
    """Drafts whose first token is the true greedy continuation (accepted) and the rest not (rejected)."""
    right, wrong = oracle_drafts(references, prompts, pools, False), oracle_drafts(references, prompts, pools, True)

    def propose(seq_ids: list[str], drafts: list[list[int]]) -> list[list[int]]:
        return [[*r[:1], *w[1:]] for r, w in zip(right(seq_ids, drafts), wrong(seq_ids, drafts), strict=True)]

    return propose
