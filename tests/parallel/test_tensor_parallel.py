"""Tensor + expert parallel over real gloo ranks on CPU: N ranks give one rank's logits.

Every test runs rank 0 in the test process and spawns the others (dayzero.parallel.group);
the reference is the same checkpoint on one rank, in-process, so the comparison is between
two independent runs of the model, not against numbers taken from the code under test.
fp32 on both sides: the ranks sum partial results in another order, so differences are
rounding (~1e-7); 1e-5 catches a wrong slice, a missing reduce or a rank's experts dropped.
"""

from __future__ import annotations

import pytest
import torch

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill
from dayzero.parallel import Group, ParallelConfig, ParallelError
from dayzero.parallel.group import run_group
from dayzero.quant.quantize import quantize_checkpoint

from ..conftest import random_ids

TOL = 1e-5
STEPS = 16
# every attention kind (sliding, CSA, HCA), hash + top-k MoE (conftest's TINY), sizes that split
TP4 = dict(o_groups=4, n_routed_experts=8)
TP3 = dict(num_attention_heads=6, o_groups=3, index_n_heads=12, n_routed_experts=6, moe_intermediate_size=18)
# FP8 dense weights sliced by whole 128-row / 128-column blocks over 2 ranks; FP4 experts
FP8_TP2 = dict(
    hidden_size=64,
    head_dim=64,
    q_lora_rank=32,
    o_lora_rank=128,
    index_head_dim=32,
    moe_intermediate_size=256,
    n_routed_experts=4,
)


def greedy_run(group: Group, path, prompt: list[int], steps: int) -> dict:
    """Prompt logits, then ``steps`` greedy decode steps' logits [steps + 1, V]; bytes and counts."""
    model = load_model(path, progress=False, group=group)
    pools = pools_for(model.cfg, torch.float32, len(prompt) + steps + 1)
    logits = [prefill(model, pools, ["s"], [prompt])[0]]
    prefill_counts = dict(group.counts)
    for _ in range(steps):
        logits.append(decode(model, pools, ["s"], [int(logits[-1].argmax())])[0])
    experts = sum(t.numel() * t.element_size() for n, t in model.state_dict().items() if ".ffn.experts." in n)
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {
        "logits": torch.stack(logits),
        "expert_bytes": experts,
        "bytes": total,
        "prefill_counts": prefill_counts,
        "counts": dict(group.counts),
    }


def _compare(path, ranks: int, seed: int = 5) -> tuple[dict, dict]:
    prompt = random_ids(37, 96, seed)  # > window (8), several CSA (4) and HCA (8) entries
    single = run_group(1, greedy_run, path, prompt, STEPS)
    split = run_group(ranks, greedy_run, path, prompt, STEPS)
    assert single["counts"] == {}  # one rank: no collective at all
    err = (split["logits"] - single["logits"]).abs().max().item()
    assert err < TOL, f"{ranks} ranks differ from one by {err:.2e}"
    assert single["logits"].abs().max().item() > 100 * TOL  # not two near-zero tensors
    assert split["expert_bytes"] * ranks == single["expert_bytes"]  # each rank holds 1/N of the experts
    return single, split


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_tensor_parallel_equals_one_rank(checkpoint_factory, ranks):
    path = checkpoint_factory("tp4", **TP4)
    single, split = _compare(path, ranks)
    assert split["bytes"] < single["bytes"]
    # a decode step: the embedding's reduce, wo_b's and the MoE's in each of 3 layers, the indexer
    # scores' in the one CSA layer (one tile at this length), then the logits' gather
    decode_counts = {k: v - split["prefill_counts"].get(k, 0) for k, v in split["counts"].items()}
    assert decode_counts == {"all_reduce": STEPS * (1 + 2 * 3 + 1), "all_gather": STEPS}


@pytest.mark.slow
def test_three_ranks_on_six_heads(checkpoint_factory):
    _compare(checkpoint_factory("tp3", **TP3), 3)


def test_fp4_experts_and_fp8_dense_split_in_packed_form(checkpoint_factory, tmp_path_factory):
    src = checkpoint_factory("fp8_tp2", **FP8_TP2)
    path = quantize_checkpoint(src, tmp_path_factory.mktemp("fp8_tp2"), progress=False, shards=2)
    single, split = _compare(path, 2)
    assert single["logits"].shape[1] == 96


def _four_ranks() -> Group:
    """Rank 0 of 4, for checks that refuse before any collective (no ranks needed)."""
    return Group(ParallelConfig(4, 0), process_group=object())


def test_indivisible_sizes_are_refused_before_loading(checkpoint_factory, tmp_path_factory):
    with pytest.raises(ParallelError, match="o_groups 2 cannot be split over 4 ranks"):
        load_model(checkpoint_factory("tiny"), progress=False, group=_four_ranks())
    with pytest.raises(ParallelError, match="n_routed_experts 6 cannot be split over 4 ranks"):
        load_model(checkpoint_factory("tp4_6e", o_groups=4), progress=False, group=_four_ranks())
    src = checkpoint_factory("fp8_tp4", **{**FP8_TP2, "o_groups": 4})
    fp8 = quantize_checkpoint(src, tmp_path_factory.mktemp("fp8_tp4"), progress=False)
    with pytest.raises(ParallelError, match=r"layers.0.attn.wq_b.weight: 256 rows over 4 ranks is 64 per rank"):
        load_model(fp8, progress=False, group=_four_ranks())
