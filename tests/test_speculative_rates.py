"""Speculation that cannot run on a model is refused when a worker starts, not at every step.

A verify step writes k + 1 positions and may span one compressor window at most (kv.snapshot):
with a compress rate of 2, two drafts per step raised ValueError in every decode step.
"""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.completion import Completion
from dayzero.config import CSA, HCA
from dayzero.demo import add_mtp, write_checkpoint
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill
from dayzero.parallel import Group
from dayzero.sampling import SamplingParams
from dayzero.serving.rank_loading import load_ranks
from dayzero.settings import Settings
from dayzero.speculative import Speculation, speculative_step
from dayzero.speculative_checks import speculation_problem

from .conftest import random_ids, tiny_config


@pytest.fixture(scope="module")
def rate_two(tmp_path_factory):
    out = write_checkpoint(tmp_path_factory.mktemp("rate2"), tiny_config(compress_rates={CSA: 2, HCA: 8}), seed=0)
    add_mtp(out, seed=0)
    return out


def _step(model, tokens: int):
    pools = pools_for(model.cfg, torch.float32, 64, mtp=True)
    prompt = random_ids(9, model.cfg.vocab_size, seed=3)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    completion = Completion(IdsOnlyCodec(), params, (), len(prompt), 1 << 20)
    pending = completion.next(prefill(model, pools, ["s"], [prompt])[0]).token
    return speculative_step(model, pools, ["s"], [pending], [completion], Speculation(tokens))


def test_drafts_wider_than_a_compressor_window_are_named(rate_two, mtp_checkpoint):
    model = load_model(rate_two, progress=False)
    assert speculation_problem(model.cfg, len(model.mtp), 1) is None
    assert (
        speculation_problem(model.cfg, len(model.mtp), 2)
        == "of 2 makes steps of 3 positions, more than the compress rate 2"
    )
    shipped = load_model(mtp_checkpoint, progress=False)
    assert speculation_problem(shipped.cfg, len(shipped.mtp), 2) is None  # rates 4 and 8
    _step(model, 1)
    with pytest.raises(ValueError, match="at most one compressor window"):  # what the check spares a worker
        _step(model, 2)


def test_a_worker_refuses_them_at_load(rate_two):
    settings = Settings(checkpoint=rate_two, speculative_tokens=2, device="cpu")
    with pytest.raises(ValueError, match="^DAYZERO_SPECULATIVE_TOKENS of 2 makes steps of 3 positions"):
        load_ranks(settings, Group(), shared=False)
