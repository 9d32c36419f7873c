"""The attention-state budget a worker chooses (serving/budget.py) when DAYZERO_KV_BUDGET_MB is unset."""

from __future__ import annotations

import logging

import pytest

from dayzero.config import ModelConfig
from dayzero.parallel.collectives import Group
from dayzero.quant.inspect import PRESETS
from dayzero.serving.budget import DeviceMemory, budget_pools, device_budget
from dayzero.serving.rank_loading import load_ranks
from dayzero.settings import Settings

MIB, GIB = 1 << 20, 1 << 30
WIDE_WINDOW = 131072  # a tiny model's window ring, Flash's scaled up: 16 of them pass 256 MiB


def _flash() -> ModelConfig:
    return ModelConfig.from_dict(PRESETS["deepseek-v4-flash"])


def test_a_worker_whose_windows_pass_256_mib_starts_with_the_default_budget(checkpoint_factory, caplog):
    """The default was 256 MiB: a worker whose DAYZERO_MAX_BATCH windows take more (V4-Flash's 16,
    18 MiB each in bf16) refused to start, DAYZERO_KV_BUDGET_MB=256 cannot hold the sliding windows.
    Here a window of 131072 rows, 3 layers of 16 float32 values each: 131072 * 3 * 16 * 4 B = 24 MiB
    a sequence, 384 MiB for 16."""
    ckpt = checkpoint_factory("wide_window", sliding_window=WIDE_WINDOW, max_position_embeddings=2 * WIDE_WINDOW)
    settings = Settings(checkpoint=ckpt)
    with caplog.at_level(logging.INFO, logger="dayzero.worker"):
        ranks, _ = load_ranks(settings, Group(), shared=False)
    pools = ranks.pools
    assert pools.window.nbytes == 16 * 24 * MIB  # every sequence's whole ring
    assert pools.capacity_tokens() >= 65536  # and one sequence of DAYZERO_MAX_CONTEXT
    budget = sum(t.nbytes for t in pools.tensors())
    assert 384 * MIB < budget < 400 * MIB  # the least that holds those, not 256 MiB and not more
    logged = [r.getMessage() for r in caplog.records if "attention-state budget" in r.getMessage()]
    assert logged and "the least that holds 16 sequences' windows and one sequence of 65536 tokens" in logged[0]


def test_v4_flash_plans_16_windows_and_a_whole_context_with_the_default():
    pools, budget = budget_pools(Settings(dtype="bfloat16"), _flash())
    assert pools.blocks["window"] == 16 * pools.layout.window_blocks and pools.capacity_tokens() >= 65536
    assert budget.bytes > 256 * MIB and budget.chosen_by.startswith("the least that holds 16 sequences' windows")


def test_a_small_model_keeps_256_mib(tiny_checkpoint):
    pools, budget = budget_pools(Settings(), ModelConfig.from_file(tiny_checkpoint))
    assert budget.bytes == 256 * MIB and budget.chosen_by.startswith("256 MiB, more than the ")
    assert 255 * MIB < sum(t.nbytes for t in pools.tensors()) <= 256 * MIB + MIB


def test_an_explicit_budget_keeps_its_exact_meaning(tiny_checkpoint):
    pools, budget = budget_pools(Settings(kv_budget_mb=4), ModelConfig.from_file(tiny_checkpoint))
    assert budget.bytes == 4 * MIB and budget.chosen_by == "DAYZERO_KV_BUDGET_MB=4"
    assert 4 * MIB - (64 << 10) < sum(t.nbytes for t in pools.tensors()) <= 4 * MIB + (64 << 10)
    with pytest.raises(ValueError, match="DAYZERO_KV_BUDGET_MB=256 cannot hold the sliding windows of"):
        budget_pools(Settings(kv_budget_mb=256, dtype="bfloat16"), _flash())  # set, it is not raised for Flash


@pytest.mark.parametrize(
    ("total", "own", "fraction", "budget"),
    [
        (80 * GIB, 20 * GIB, 0.8, 44 * GIB),  # 64 GiB of the device for this worker, 20 of them its weights
        (1000, 100, 0.5, 400),
        (80 * GIB, 10 * GIB, 0.4, 22 * GIB),  # one of two workers on the GPU: 32 GiB its share
        (141 * GIB, 130 * GIB, 0.9, 0),  # its weights are more than its share
    ],
)
def test_the_cuda_budget_is_a_share_of_the_whole_device_less_what_the_worker_holds(total, own, fraction, budget):
    """As vLLM's gpu_memory_utilization: the fraction is of the device's total, weights and attention
    state together. It was a fraction of the memory free after the weights, measured around the load:
    a prefill and a decode worker loading side by side on one GPU (``up``'s default, cuda_ipc) each saw
    it free before the other allocated, and each took 0.8 of it; and the other's allocations during the
    load counted as this one's weights."""
    assert device_budget(total, own, fraction) == budget


def test_two_workers_loading_side_by_side_on_one_gpu_fit_in_it_together():
    """Whatever order the two loads and measurements run in: neither reads what the other holds."""
    total, weights, fraction = 80 * GIB, 10 * GIB, 0.8 / 2  # up's split for one GPU's prefill and decode
    each = device_budget(total, weights, fraction)
    assert 2 * (weights + each) <= 0.8 * total


def test_a_cuda_worker_takes_its_share_or_refuses_naming_the_numbers():
    settings = Settings(device="cuda", dtype="bfloat16", kv_memory_fraction=0.5)
    pools, budget = budget_pools(settings, _flash(), DeviceMemory(total_bytes=100 * GIB, own_bytes=30 * GIB))
    assert budget.bytes == 20 * GIB and abs(sum(t.nbytes for t in pools.tensors()) - 20 * GIB) < 4 * MIB
    with pytest.raises(ValueError) as refused:
        budget_pools(settings, _flash(), DeviceMemory(total_bytes=100 * GIB, own_bytes=int(49.5 * GIB)))
    message = str(refused.value)
    assert message.startswith(
        "DAYZERO_KV_MEMORY_FRACTION=0.5 of the device's 102400 MiB less the 50688 MiB this worker holds (its "
        "weights) is 512.0 MiB of attention state, under the "
    )
    assert "that hold 16 sequences' windows and one sequence of 65536 tokens" in message


def test_a_cuda_worker_measures_the_devices_total_and_its_own_not_what_is_free(monkeypatch):
    """What another process on the GPU allocates or frees meanwhile (free memory falling from 70 to
    30 GiB) changes nothing: the device's 80 GiB and this process's reserved 10 GiB."""
    import torch

    from dayzero.serving import rank_loading

    free = iter([70 * GIB, 30 * GIB])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (next(free), 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 10 * GIB)
    for _ in range(2):
        assert rank_loading._device_memory(torch.device("cuda")) == DeviceMemory(80 * GIB, 10 * GIB)
