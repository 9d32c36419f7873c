"""``dayzero inspect`` says when the worker it plans for would refuse to start, in the worker's own
words, and plans no pools for it (quant/inspect.py)."""

from __future__ import annotations

import pytest

from dayzero.parallel.collectives import Group
from dayzero.quant.inspect import inspect, render
from dayzero.serving.rank_loading import load_ranks
from dayzero.settings import Settings
from dayzero.settings_checks import refused_in_a_group


def test_drafts_without_an_mtp_layer_are_the_workers_refusal(tiny_checkpoint):
    """The tiny checkpoint ships no ``mtp.*`` layer: its worker refuses DAYZERO_SPECULATIVE_TOKENS, and
    inspect planned pools for it as if it started."""
    settings = Settings(checkpoint=tiny_checkpoint, speculative_tokens=1, kv_budget_mb=4)
    with pytest.raises(ValueError) as worker:
        load_ranks(settings, Group(), shared=False)
    assert "needs a checkpoint with an MTP layer" in str(worker.value)
    report = inspect(tiny_checkpoint, settings=settings)
    assert report.kv_pools["refused"] == str(worker.value) and report.kv_pools["bytes"] == 0
    assert f"none: a worker refuses to start ({worker.value})" in render(report)


def test_drafts_with_an_mtp_layer_are_planned(mtp_checkpoint):
    report = inspect(mtp_checkpoint, settings=Settings(checkpoint=mtp_checkpoint, speculative_tokens=1))
    assert "refused" not in report.kv_pools and report.kv_pools["bytes"] > 0


@pytest.mark.parametrize(
    ("settings", "service"),
    [
        (Settings(speculative_tokens=1), "prefill"),  # the followers would need each round's drafts
        (Settings(device="cuda", attention_backend="triton", decode_graphs=True), "decode"),
    ],
)
def test_settings_a_group_refuses_are_said_for_a_tensor_parallel_plan(settings, service):
    """V4-Flash ships its MTP layer, so drafts are planned for one rank; with --tensor-parallel 2 up
    and serve refuse them (and decode's CUDA graphs) before starting any rank."""
    with pytest.raises(ValueError) as group:
        refused_in_a_group(service, settings, 2)
    report = inspect("deepseek-v4-flash", tensor_parallel=2, settings=settings)
    assert report.kv_pools["refused"] == str(group.value) and report.kv_pools["bytes"] == 0
    assert "refused" not in inspect("deepseek-v4-flash", settings=settings).kv_pools  # one rank starts
