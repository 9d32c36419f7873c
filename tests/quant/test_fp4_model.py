"""An FP4-expert / FP8-dense checkpoint made by `dayzero quantize`, served packed, against transformers.

transformers loads the same file and dequantizes it (FineGrainedFP8Config(dequantize=True)),
so both sides run the same dequantized numbers in fp32: tolerance 1e-4 as for float models.
"""

from __future__ import annotations

import json

import pytest
import torch

from dayzero.align import align, reference_model
from dayzero.checkpoint import CheckpointError, load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import score
from dayzero.model.plan import AttentionOptions
from dayzero.quant.quantize import quantize_checkpoint

from ..conftest import random_ids

# shapes the MXFP4 (32) and FP8 tile sizes divide
FP4_CONFIG = dict(
    hidden_size=64,
    head_dim=32,
    q_lora_rank=32,
    o_lora_rank=32,
    moe_intermediate_size=32,
    index_head_dim=16,
    n_routed_experts=6,
)


@pytest.fixture(scope="module")
def fp4_checkpoint(checkpoint_factory, tmp_path_factory):
    src = checkpoint_factory("fp4_src", **FP4_CONFIG)
    return src, quantize_checkpoint(src, tmp_path_factory.mktemp("fp4"), progress=False)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_quantized_checkpoint_matches_transformers(fp4_checkpoint, backend):
    _, path = fp4_checkpoint
    ref, ours = reference_model(path), load_model(path, progress=False, expert_cache_bytes=1 << 20)
    # 24: past the window (8), 3 HCA entries (8), 6 CSA ones (4) of which the indexer keeps 3 (top-k)
    ids = random_ids(24, ours.cfg.vocab_size, seed=3)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    got = score(ours, pools_for(ours.cfg, torch.float32, len(ids)), "s", ids, AttentionOptions(backend))
    assert (got - expected).abs().max().item() < 1e-4


def test_fp4_experts_stay_packed_and_small(fp4_checkpoint):
    src, path = fp4_checkpoint
    float_model = load_model(src, dtype=torch.bfloat16, progress=False)
    bf16_bytes = sum(b.ffn.experts.w1.numel() * 3 * 2 for b in float_model.layers)
    model = load_model(path, dtype=torch.bfloat16, progress=False, expert_cache_bytes=0)
    counters = model.expert_converter.counters
    assert counters.packed_bytes <= 0.27 * bf16_bytes  # 4.25 bits per value vs 16
    assert model.layers[0].ffn.experts.w1.dtype == torch.int8


def test_workspace_is_reused_across_layers_and_cache_counts(fp4_checkpoint):
    _, path = fp4_checkpoint
    ids = random_ids(24, 96, seed=4)
    no_cache = load_model(path, progress=False, expert_cache_bytes=0)
    score(no_cache, pools_for(no_cache.cfg, torch.float32, 24), "s", ids)
    c = no_cache.expert_converter.counters
    one_expert = 3 * 32 * 64 * 4
    assert c.cache_hits == 0 and c.cache_bytes == 0 and c.conversions == c.cache_misses > 6
    assert c.workspace_bytes <= 6 * one_expert  # at most one layer's experts, whatever the depth
    cached = load_model(path, progress=False, expert_cache_bytes=1 << 20)
    for _ in range(2):
        score(cached, pools_for(cached.cfg, torch.float32, 24), "s", ids)
    c = cached.expert_converter.counters
    assert c.cache_hits >= c.cache_misses and 0 < c.cache_bytes <= 1 << 20


def test_unsupported_quantization_is_a_clear_error(fp4_checkpoint, tmp_path):
    _, path = fp4_checkpoint
    raw = json.loads((path / "config.json").read_text())
    for bad, message in (
        (dict(quant_method="awq"), "quant_method 'awq'"),
        (dict(expert_dtype="int4"), "expert_dtype 'int4'"),
    ):
        broken = tmp_path / bad.get("quant_method", "int4experts")
        broken.mkdir()
        (broken / "model.safetensors").symlink_to(path / "model.safetensors")
        (broken / "config.json").write_text(
            json.dumps({**raw, "quantization_config": {**raw["quantization_config"], **bad}})
        )
        with pytest.raises(CheckpointError, match=message):
            load_model(broken, progress=False)


def test_align_runs_on_the_quantized_checkpoint(fp4_checkpoint):
    _, path = fp4_checkpoint
    report = align(path, [0, 5, 9, 14, 3, 7, 8, 2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49], tokens=3)
    assert report.ok and report.max_abs_err < 1e-4


def test_expert_dtype_is_read_from_the_quantization_config_or_the_top_level():
    from dayzero.quant.spec import QuantConfigError, quant_spec

    q = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    assert quant_spec({"quantization_config": {**q, "expert_dtype": "fp4"}}).packed_experts
    assert quant_spec({"quantization_config": q, "expert_dtype": "fp4"}).packed_experts  # top level
    assert quant_spec({"quantization_config": q}).expert_dtype == "fp8"  # transformers' default
    assert quant_spec({}).expert_dtype is None and not quant_spec({}).packed_experts
    with pytest.raises(QuantConfigError, match="fmt 'e5m2'"):
        quant_spec({"quantization_config": {**q, "fmt": "e5m2"}})
