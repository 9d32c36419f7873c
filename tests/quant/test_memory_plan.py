"""The memory plan (``dayzero inspect``) against what the runtime holds: the bytes of the tensors of
a tiny model ``load_model`` built, and of the pools ``pools_for`` carved (sums of ``nbytes``)."""

from __future__ import annotations

import json

import pytest
import torch

from dayzero import cli
from dayzero.checkpoint import load_model, packed_experts
from dayzero.config import ModelConfig
from dayzero.kv.pools import pools_for
from dayzero.quant.memory_plan import GIB, ModelTensors, Serving, WeightBytes, memory_plan

from .test_fp4_model import fp4_checkpoint  # noqa: F401 - the fixture: a tiny checkpoint, its experts FP4

DTYPES = [torch.float32, torch.bfloat16]


def planned_bytes(cfg: ModelConfig, serving: Serving) -> dict[str, float]:
    """The plan's regions in bytes (one device, no expert cache)."""
    plan = memory_plan(cfg, WeightBytes.of(ModelTensors.of(cfg, serving)), serving, devices=1, expert_cache_gib=0.0)
    return {region: gib * GIB for region, gib in plan.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shipped", ["tiny", "mtp", "fp4"])
def test_the_planned_weights_are_the_bytes_the_loaded_model_holds(shipped, dtype, request):
    """The plan held every dense parameter in DAYZERO_DTYPE, while the loader keeps the norms,
    hyper-connections, sinks and biases in fp32 (bfloat16: 2 bytes short on each), and left out the
    buffers it holds (the hash-routing table, the routing correction bias)."""
    path = {
        "tiny": lambda: request.getfixturevalue("tiny_checkpoint"),
        "mtp": lambda: request.getfixturevalue("mtp_checkpoint"),
        "fp4": lambda: request.getfixturevalue("fp4_checkpoint")[1],
    }[shipped]()
    model = load_model(path, dtype, progress=False)
    held = sum(t.nbytes for t in model.state_dict().values())
    cfg = ModelConfig.from_file(path)
    width = torch.finfo(dtype).bits // 8
    serving = Serving(1, 64, packed_experts(cfg), width, 16, mtp_layers=int(shipped == "mtp"))
    assert planned_bytes(cfg, serving)["packed_weights"] == held


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 5, 64])
@pytest.mark.parametrize(("context", "mtp"), [(100, False), (8192, False), (37, True)])
def test_the_planned_pools_are_the_bytes_the_runtime_s_pools_take(context, mtp, block_size, dtype, mtp_checkpoint):
    """The plan sized the pools in blocks of 64 rows, while the runtime's are DAYZERO_BLOCK_SIZE's (16
    unless set), and a sequence holds whole blocks (its window ring; its entries, rounded up)."""
    cfg, batch = ModelConfig.from_file(mtp_checkpoint), 3
    pools = pools_for(cfg, dtype, context, batch, block_size, device="meta", mtp=mtp)
    held = sum(t.nbytes for t in pools.tensors())
    serving = Serving(batch, context, False, torch.finfo(dtype).bits // 8, block_size, int(mtp), mtp_state=mtp)
    assert planned_bytes(cfg, serving)["attention_pools"] == held


GRAPHS = {"DAYZERO_DECODE_GRAPHS": "1", "DAYZERO_DEVICE": "cuda", "DAYZERO_ATTENTION_BACKEND": "triton"}


@pytest.mark.parametrize("graphs", [False, True])
def test_the_planned_pools_are_the_pools_a_worker_of_the_same_settings_allocates(
    graphs, tiny_checkpoint, monkeypatch, capsys
):
    """The plan ignored DAYZERO_KV_BUDGET_MB: a worker allocates pools of the whole budget whatever
    the batch (and under DAYZERO_DECODE_GRAPHS one more sequence's window, the padding rows'), while
    the plan counted --batch's sequences alone: 0.0002 GiB planned where a worker held 0.0312."""
    from dayzero.parallel.collectives import Group
    from dayzero.serving.rank_loading import load_ranks
    from dayzero.settings import Settings

    env = {"DAYZERO_KV_BUDGET_MB": "32", "DAYZERO_MAX_BATCH": "3", "DAYZERO_BLOCK_SIZE": "4"}
    for name, value in (env | (GRAPHS if graphs else {})).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["inspect", str(tiny_checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    settings = Settings(checkpoint=tiny_checkpoint).model_copy(update={"device": "cpu"})  # (allocated here)
    ranks, _ = load_ranks(settings, Group(), shared=False)
    held = sum(t.nbytes for t in ranks.pools.tensors())
    assert report["kv_pools"]["bytes"] == held and held > 31 << 20  # the budget's, not the batch's
    assert report["kv_pools"]["windows"] == 3 + graphs  # DAYZERO_MAX_BATCH, and the graphs' padding rows
    assert report["memory_gib"]["attention_pools"] == round(held / GIB, 4)
    monkeypatch.delenv("DAYZERO_KV_BUDGET_MB")  # unset: 256 MiB on CPU, more than the 32 planned above; on
    assert cli.main(["inspect", str(tiny_checkpoint), "--json"]) == 0  # CUDA the least (a share of the device after)
    planned = json.loads(capsys.readouterr().out)["memory_gib"]["attention_pools"]
    assert planned < 1 / 1024 if graphs else planned == pytest.approx(0.25, abs=1e-3)
