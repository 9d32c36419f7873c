"""Loading: both namings, sharded files, and one clear error per kind of broken checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dayzero.align import reference_model
from dayzero.checkpoint import CheckpointError, load_model
from dayzero.config import ConfigError
from dayzero.kv.pools import pools_for
from dayzero.model.forward import score

from .conftest import random_ids


def _logits(path: Path, ids: list[int]) -> torch.Tensor:
    model = load_model(path, progress=False)
    return score(model, pools_for(model.cfg, torch.float32, len(ids)), "s", ids)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_published_transformers_and_sharded_namings_load_the_same(tiny_checkpoint, tmp_path):
    ref = reference_model(tiny_checkpoint)
    ref.save_pretrained(tmp_path / "hf")  # transformers' naming: model.embed_tokens.weight, ...
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    keys = load_file(str(tmp_path / "hf" / "model.safetensors")).keys()
    assert "model.embed_tokens.weight" in keys and "model.hc_head.hc_fn" in keys
    assert "embed.weight" in load_file(str(tiny_checkpoint / "model.safetensors"))
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ids = random_ids(20, 96, seed=0)
    published = _logits(tiny_checkpoint, ids)
    assert torch.equal(published, _logits(tmp_path / "hf", ids))
    assert torch.equal(published, _logits(tmp_path / "sharded", ids))


def test_bfloat16_load_keeps_fp32_parameters(tiny_checkpoint):
    model = load_model(tiny_checkpoint, dtype=torch.bfloat16, progress=False)
    assert model.layers[0].attn.wq_a.weight.dtype == torch.bfloat16
    assert model.layers[0].hc_attn_fn.dtype == torch.float32 and model.norm.weight.dtype == torch.float32
    logits = score(model, pools_for(model.cfg, torch.bfloat16, 3), "s", [1, 2, 3])
    assert torch.isfinite(logits).all()


def test_missing_directory_and_missing_weights(tmp_path, tiny_checkpoint):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere")
    broken = _copy(tiny_checkpoint, tmp_path / "noweights")
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(broken)
    (broken / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(broken)


def test_wrong_model_type(tmp_path, tiny_checkpoint):
    broken = _copy(tiny_checkpoint, tmp_path / "llama")
    raw = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**raw, "model_type": "llama"}))
    with pytest.raises(ConfigError, match="model_type must be 'deepseek_v4', got 'llama'"):
        load_model(broken)


def _edit_tensors(src: Path, dst: Path, edit) -> Path:
    broken = _copy(src, dst)
    tensors = load_file(str(broken / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(broken / "model.safetensors"))
    return broken


def test_missing_tensor_is_named(tmp_path, tiny_checkpoint):
    broken = _edit_tensors(tiny_checkpoint, tmp_path / "missing", lambda t: t.pop("layers.1.attn.indexer.wq_b.weight"))
    with pytest.raises(CheckpointError, match="missing tensor 'layers.1.attn.indexer.wq_b.weight'"):
        load_model(broken)


def test_missing_expert_is_named(tmp_path, tiny_checkpoint):
    broken = _edit_tensors(tiny_checkpoint, tmp_path / "noexpert", lambda t: t.pop("layers.2.ffn.experts.3.w2.weight"))
    with pytest.raises(CheckpointError, match="missing tensor layers.2.ffn.experts.3.w2.weight"):
        load_model(broken)


@pytest.mark.parametrize("expert", [6, -1])
def test_a_hash_table_routing_outside_the_experts_is_named(tmp_path, tiny_checkpoint, expert):
    """It was an IndexError traceback from the first forward (generate, a worker's warm-up)."""

    def edit(t):
        t["layers.0.ffn.gate.tid2eid"][5, 1] = expert

    broken = _edit_tensors(tiny_checkpoint, tmp_path / "hash", edit)
    message = rf"^tensor 'layers.0.ffn.gate.tid2eid' routes to expert {expert}, outside \[0, 6\)$"
    with pytest.raises(CheckpointError, match=message):
        load_model(broken, progress=False)


def test_wrong_shape_is_named(tmp_path, tiny_checkpoint):
    def edit(t):
        t["layers.0.attn.wkv.weight"] = torch.zeros(15, 32)

    broken = _edit_tensors(tiny_checkpoint, tmp_path / "shape", edit)
    with pytest.raises(CheckpointError, match=r"'layers.0.attn.wkv.weight' has shape \[15, 32\], expected \[16, 32\]"):
        load_model(broken)


def test_a_partial_mtp_layer_is_named(tmp_path, tiny_checkpoint):
    def edit(t):
        t["mtp.0.attn.wq_a.weight"] = torch.zeros(16, 32)

    broken = _edit_tensors(tiny_checkpoint, tmp_path / "extra", edit)
    with pytest.raises(CheckpointError, match=r"^missing tensor 'mtp.0.hc_attn_fn' \(and \d+ more"):
        load_model(broken)


def test_loading_reports_progress_tensor_by_tensor(tiny_checkpoint):
    seen: list[tuple[int, int]] = []
    load_model(tiny_checkpoint, progress=False, on_progress=lambda done, total: seen.append((done, total)))
    total = seen[-1][1]
    assert [done for done, _ in seen] == list(range(1, total + 1)) and {t for _, t in seen} == {total}


def test_pinned_attributes_follow_a_later_assignment(tiny_checkpoint):
    """load_model pins submodules and parameters in the instance dicts (no nn.Module.__getattr__ on
    the decode path); assigning either afterwards is still what the model reads."""
    model = load_model(tiny_checkpoint, progress=False)
    block = model.layers[0]
    assert "attn" in vars(block) and "weight" in vars(block.attn.wq_a)  # pinned: found without __getattr__
    replacement = torch.nn.Parameter(torch.zeros_like(block.attn.wq_a.weight), requires_grad=False)
    block.attn.wq_a.weight = replacement
    assert block.attn.wq_a.weight is replacement and block.attn.wq_a._parameters["weight"] is replacement
    head = torch.nn.Linear(1, 1)
    model.head = head
    assert model.head is head and model._modules["head"] is head


def test_fp4_experts_need_inputs_in_whole_32_value_blocks(checkpoint_factory, tmp_path):
    """hidden 48 with FP4 experts: 24 bytes (48 values) per row cannot take one E8M0 scale per 32.
    The skeleton floored 48 / 32 to 1 scale, and the weight check crashed in a FormatError."""
    src = checkpoint_factory("hidden48", hidden_size=48)
    tensors = load_file(str(src / "model.safetensors"))
    for key in [k for k in tensors if ".ffn.experts." in k]:
        rows, cols = tensors[key].shape
        tensors[key] = torch.zeros(rows, cols // 2, dtype=torch.int8)
        tensors[key.replace(".weight", ".scale")] = torch.full((rows, cols // 32), 127, dtype=torch.uint8)
    out = _copy(src, tmp_path / "fp4")
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="FP4 experts need hidden_size divisible by 32; config.json has 48"):
        load_model(out, progress=False)
