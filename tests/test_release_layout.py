"""Checkpoints exactly as DeepSeek publishes them: E8M0 scales, shards, mtp.0.*, compress_ratios, no tokenizer.

The reference is transformers loading the same files (FineGrainedFP8Config, dequantizing);
both sides then run the same numbers in fp32, so logits agree to rounding (1e-4, as align).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dayzero import cli
from dayzero.align import align
from dayzero.checkpoint import CheckpointError, load_model
from dayzero.demo import add_mtp, write_checkpoint
from dayzero.quant.formats import dequant_fp8, dequant_mxfp4
from dayzero.quant.quantize import quantize_checkpoint

from .conftest import random_ids, tiny_config
from .quant.test_fp4_model import FP4_CONFIG
from .transformers_logs import shown_warnings

RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
RELEASE = tiny_config(**FP4_CONFIG, compress_rates=RATES, layer_types=["sliding_attention", *RATES])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dayzero.cli", *args], capture_output=True, text=True, timeout=300)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    return out


def _rewrite(path: Path, edit) -> Path:
    tensors = _tensors(path)
    edit(tensors)
    for file in path.glob("*.safetensors"):
        file.unlink()
    (path / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """As released: FP4 experts and FP8 dense with float8_e8m0fnu scales, 3 shards with an index,
    mtp.0.*, compress_ratios with the MTP entry last and no layer_types, no tokenizer files."""
    src = write_checkpoint(tmp_path_factory.mktemp("release_src"), RELEASE, seed=5)
    add_mtp(src, seed=5)
    out = quantize_checkpoint(src, tmp_path_factory.mktemp("release"), progress=False, shards=3)
    config = json.loads((out / "config.json").read_text())
    del config["layer_types"]
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_the_release_layout_is_what_the_fixture_writes(release):
    config = json.loads((release / "config.json").read_text())
    assert config["compress_ratios"] == [0, 4, 128, 0] and config["num_nextn_predict_layers"] == 1
    assert config["quantization_config"]["expert_dtype"] == "fp4" and "layer_types" not in config
    assert len(json.loads((release / "model.safetensors.index.json").read_text())["weight_map"]) > 100
    assert len(list(release.glob("model-*-of-00003.safetensors"))) == 3 and not (release / "tokenizer.json").exists()
    tensors = _tensors(release)
    assert tensors["layers.1.ffn.experts.0.w1.scale"].dtype == torch.float8_e8m0fnu
    assert tensors["layers.1.attn.wq_a.scale"].dtype == torch.float8_e8m0fnu
    assert tensors["mtp.0.ffn.experts.2.w3.weight"].dtype == torch.int8 and "mtp.0.e_proj.scale" in tensors


@pytest.mark.slow
def test_release_matches_transformers_through_align_and_generates_ids(release, capsys, recwarn):
    """In this process (cli.main, as ``python -m dayzero.cli`` calls it): a process each paid torch's
    import four times (test_fp8_experts_as_the_base_releases_ship_them runs one of its own)."""
    ids = ",".join(map(str, random_ids(140, 96, 1)))
    al = cli.main(["align", str(release), "--prompt-ids", ids, "--tokens", "3"])
    printed = capsys.readouterr()
    assert al == 0, printed.out + printed.err
    assert "OK" in printed.out
    gen = cli.main(["generate", "--checkpoint", str(release), "--prompt-ids", "0,5,6,7", "--max-tokens", "5"])
    printed = capsys.readouterr()
    assert gen == 0, printed.err
    ids = [int(t) for t in printed.out.strip().split(",")]  # no tokenizer: the ids themselves
    assert len(ids) == 5 and all(0 <= t < 96 for t in ids)
    bad = cli.main(["generate", "--checkpoint", str(release), "--prompt-ids", "0,96", "--max-tokens", "2"])
    printed = capsys.readouterr()
    assert bad != 0 and printed.err.strip() == "error: token id 96 is outside the vocabulary [0, 96)"
    text = cli.main(["generate", "--checkpoint", str(release), "--prompt", "hi", "--max-tokens", "2"])
    printed = capsys.readouterr()
    assert text == 2 and "no tokenizer.json" in printed.err and "Traceback" not in printed.err
    assert shown_warnings(recwarn) == []  # on a process's stderr, which the assertions above read


def test_e8m0_uint8_and_float32_scales_load_the_same_numbers(release, tmp_path):
    import shutil

    as_e8m0 = load_model(release, progress=False)
    for name, convert in (
        ("uint8", lambda s: s.view(torch.uint8)),
        ("float32", lambda s: torch.exp2(s.view(torch.uint8).float() - 127)),  # the Base releases' spelling
    ):
        copy = shutil.copytree(release, tmp_path / name)
        scales = lambda t: t.update({k: convert(v) for k, v in t.items() if v.dtype == torch.float8_e8m0fnu})  # noqa: B023
        other = load_model(_rewrite(copy, scales), progress=False)
        for (key, a), b in zip(as_e8m0.state_dict().items(), other.state_dict().values(), strict=True):
            assert torch.equal(a, b), (name, key)
    # and by hand: expert 0's first row of w1 is its E2M1 codes times 2^(byte - 127)
    stored = _tensors(release)
    w1, s1 = stored["layers.1.ffn.experts.0.w1.weight"], stored["layers.1.ffn.experts.0.w1.scale"]
    assert as_e8m0.layers[1].ffn.experts.w1_scale[0].tolist() == s1.view(torch.uint8).tolist()
    by_hand = dequant_mxfp4(w1, s1.view(torch.uint8))
    assert by_hand.abs().max() > 0.01 and s1.view(torch.uint8).min() > 100


def test_value_converted_scales_are_refused_at_start(release, tmp_path):
    import shutil

    copy = shutil.copytree(release, tmp_path / "zeroed")

    def convert_by_value(t):  # the bug: float8_e8m0fnu 2^-7 -> uint8 0 (vLLM hit exactly this)
        t.update({k: v.to(torch.uint8) for k, v in t.items() if ".experts." in k and v.dtype == torch.float8_e8m0fnu})

    with pytest.raises(CheckpointError, match=r"weight check failed: layers\.\d\.ffn\.experts\.0\.w1 decodes to"):
        load_model(_rewrite(copy, convert_by_value), progress=False)


def test_mtp_layer_loads_into_its_own_module(release):
    model = load_model(release, progress=False)
    assert len(model.mtp) == 1 and model.cfg.mtp_layer_type == "sliding_attention"
    mtp, stored = model.mtp[0], _tensors(release)
    assert not hasattr(mtp.attn, "compressor") and not hasattr(mtp.ffn.gate, "tid2eid")  # sliding, score-routed
    e_proj = dequant_fp8(stored["mtp.0.e_proj.weight"], stored["mtp.0.e_proj.scale"])
    assert torch.equal(mtp.e_proj.weight, e_proj) and torch.equal(mtp.enorm.weight, stored["mtp.0.enorm.weight"])
    assert torch.equal(mtp.ffn.experts.w2[3], stored["mtp.0.ffn.experts.3.w2.weight"])
    assert torch.equal(mtp.hc_head_fn, stored["mtp.0.hc_head_fn"])
    assert model.weight_check.expert_matrices == 4 * 3  # w1, w2, w3 of three MoE layers and the MTP layer


def test_missing_unused_and_wrong_dtype_tensors_are_named(release, tmp_path, caplog):
    import shutil

    def drop(t):
        t.pop("mtp.0.h_proj.weight")

    with pytest.raises(CheckpointError, match="missing tensor 'mtp.0.h_proj.weight'"):
        load_model(_rewrite(shutil.copytree(release, tmp_path / "a"), drop), progress=False)

    def extra(t):
        t.update({f"layers.{i}.attn.surprise": torch.zeros(2) for i in range(3)}, **{"extra.table": torch.zeros(1)})

    with caplog.at_level(logging.WARNING, logger="dayzero.checkpoint"):
        load_model(_rewrite(shutil.copytree(release, tmp_path / "b"), extra), progress=False)
    assert "ignoring 4 tensor(s) the model does not use: extra.table, layers.*.attn.surprise (3)" in caplog.text

    def bf16_expert(t):
        t["layers.2.ffn.experts.1.w2.weight"] = torch.zeros(64, 16, dtype=torch.bfloat16)

    with pytest.raises(CheckpointError, match=r"'layers.2.ffn.experts.1.w2.weight' is bfloat16, expected int8"):
        load_model(_rewrite(shutil.copytree(release, tmp_path / "c"), bf16_expert), progress=False)

    def bf16_scale(t):
        t["layers.0.attn.wkv.scale"] = t["layers.0.attn.wkv.scale"].view(torch.uint8).to(torch.bfloat16)

    with pytest.raises(CheckpointError, match=r"'layers.0.attn.wkv.scale' is bfloat16, expected float8_e8m0fnu"):
        load_model(_rewrite(shutil.copytree(release, tmp_path / "d"), bf16_scale), progress=False)


def test_fp8_experts_as_the_base_releases_ship_them_match_transformers(checkpoint_factory, tmp_path):
    src = checkpoint_factory("fp4_src", **FP4_CONFIG)
    made = _cli("quantize", str(src), str(tmp_path / "fp8"), "--experts", "fp8")
    assert made.returncode == 0, made.stderr
    assert load_file(str(tmp_path / "fp8" / "model.safetensors"))["layers.1.ffn.experts.0.w1.weight"].dtype == (
        torch.float8_e4m3fn
    )
    report = align(tmp_path / "fp8", random_ids(30, 96, 2), tokens=2)
    assert report.ok, report
