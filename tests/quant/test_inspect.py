"""`dayzero inspect` on DeepSeek-V4-Flash's shape (transformers' DeepseekV4Config defaults)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from dayzero import cli
from dayzero.checkpoint import CheckpointError, load_model
from dayzero.model.weights import skeleton
from dayzero.quant.inspect import inspect


def test_flash_counts_match_transformers_and_the_published_sizes(tmp_path):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = DeepseekV4Config()
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        reference = sum(p.numel() for p in DeepseekV4ForCausalLM(config).parameters())
    report = inspect(tmp_path / "config.json", batch=8, context=65536, devices=8)
    assert report.total_params == reference  # same counting: buffers (hash table, routing bias) excluded
    assert abs(report.total_params / 284e9 - 1) < 0.01  # published: 284B
    # published: 13B active; counting the embedding table as one looked-up row gives 13.26B
    assert abs(report.active_params_without_embedding / 13e9 - 1) < 0.03
    assert report.plan["experts"] == "fp4" and report.memory_gib["packed_weights"] > 10


def test_an_interrupted_quantize_leaves_no_checkpoint_that_looks_whole(tiny_checkpoint, tmp_path, monkeypatch):
    """Cut short while copying the tokenizer, quantize left config.json and the weights: a checkpoint
    that generate took, printing token ids for text."""
    from dayzero.quant import quantize

    src = shutil.copytree(tiny_checkpoint, tmp_path / "src")
    (src / "tokenizer.json").write_text("{}")

    def cut_short(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(quantize, "_quantized", lambda name, tensor, experts: {name: tensor})  # (fast)
    monkeypatch.setattr(quantize.shutil, "copyfile", cut_short)
    with pytest.raises(KeyboardInterrupt):
        quantize.quantize_checkpoint(src, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no out, no build left beside it


def test_quantize_and_inspect_commands(tmp_path, checkpoint_factory):
    from .test_fp4_model import FP4_CONFIG

    path = tmp_path / "q"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "dayzero.cli",
            "quantize",
            str(checkpoint_factory("fp4_src", **FP4_CONFIG)),
            str(path),
            "--experts",
            "fp4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    out = subprocess.run(
        [sys.executable, "-m", "dayzero.cli", "inspect", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["tensors_by_dtype"]["int8"] == 3 * 6 * 3 and report["unmapped_tensors"] == []
    assert set(report["memory_gib"]) == {
        "packed_weights",
        "dequant_workspace",
        "expert_cache",
        "attention_pools",
        "hyper_connection_state",
        "activations",
    }


def test_released_configs_by_name_say_how_many_h200s_they_need():
    flash = inspect("deepseek-v4-flash", batch=1, context=65536)
    assert flash.total_params == 284_325_869_015  # transformers' DeepseekV4Config() count (published 284B)
    # FP4 experts: 277.03B values x 4.25 bits = 147.2 GB alone, over one H200's 141 GB
    assert flash.memory_gib["packed_weights"] * (1 << 30) > 141e9
    assert flash.plan["fits_one_h200"] is False and flash.plan["h200s_needed"] == 2
    pro = inspect("deepseek-v4-pro", batch=1, context=65536)
    assert abs(pro.total_params / 1.6e12 - 1) < 0.03  # published 1.6T; unknown Pro fields are Flash's
    assert pro.plan["h200s_needed"] >= 8  # peers serve Pro on 8 H200
    # the count named is one --devices takes (it divides the experts: 15 of Pro's 384 was refused), and fits
    needed = inspect("deepseek-v4-pro", batch=1, context=65536, devices=pro.plan["h200s_needed"])
    assert needed.plan["fits_one_h200"] is True
    out = subprocess.run(
        [sys.executable, "-m", "dayzero.cli", "inspect", "deepseek-v4-pro", "--context", "1048576"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "h200s_needed" in out.stdout and "packed_weights" in out.stdout


def test_a_config_that_does_not_describe_the_weights_is_refused_as_generate_refuses_it(tiny_checkpoint, tmp_path):
    """A config without hidden_size counts a 4096-wide model: the weights' headers say 32."""

    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    del config["hidden_size"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as loading:
        load_model(ckpt, progress=False)
    assert str(loading.value).startswith("tensor 'embed.weight' has shape [96, 32], expected [96, 4096] (and ")
    with pytest.raises(CheckpointError) as inspecting:
        inspect(ckpt)
    assert str(inspecting.value) == str(loading.value)
    assert cli.main(["inspect", str(ckpt)]) == 2


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--context", "2000000"], "--context 2000000 is past the model's (max_position_embeddings 1048576)"),
        (["--devices", "3"], "--devices 3 does not divide the model's 256 routed experts"),
    ],
)
def test_a_plan_the_model_could_never_serve_is_refused(option, message, capsys):
    """(They were planned: a context past the model's, experts that do not split over the devices.)"""

    assert cli.main(["inspect", "deepseek-v4-flash", *option]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_config_without_weights_says_the_plan_is_the_config_s_alone(tmp_path):
    """A checkpoint directory before its weights are downloaded: planned from config.json, and the
    report says no weights were read (it showed "-" where the dtypes go)."""
    from transformers import DeepseekV4Config

    from dayzero.quant.inspect import render

    DeepseekV4Config().save_pretrained(tmp_path)
    text = render(inspect(tmp_path))
    assert (
        "tensors by dtype   none: no weights read (the plan is the config's alone, with the release's FP4 experts)"
        in text
    )


def test_inspect_of_a_name_it_does_not_know_names_the_released_configs(capsys):
    """A released model's name as its hub spells it was "no config.json at deepseek-ai/DeepSeek-V4-Flash",
    which did not say that ``inspect`` also takes ``deepseek-v4-flash``."""

    assert cli.main(["inspect", "deepseek-ai/DeepSeek-V4-Flash"]) == 2
    err = capsys.readouterr().err
    assert "at deepseek-ai/DeepSeek-V4-Flash, nor a released config: deepseek-v4-flash, deepseek-v4-pro" in err


@pytest.mark.parametrize(("dtype", "torch_dtype"), [(None, torch.float32), ("bfloat16", torch.bfloat16)])
def test_the_plan_holds_the_weights_in_the_dtype_the_run_loads_them_in(
    dtype, torch_dtype, checkpoint_factory, monkeypatch, capsys
):
    """The plan held the dense weights in bf16 always, while DAYZERO_DTYPE (float32 unless set) is what
    they load in: a default run's were half what it holds, and a float32 checkpoint was said to be
    "dense bf16 (FP8 dequantized at load)". (test_memory_plan.py: the bytes exactly.)"""
    checkpoint = checkpoint_factory("wide_vocab", vocab_size=1 << 16)  # 16 MiB of float32 weights (GiB: 4 decimals)
    monkeypatch.delenv("DAYZERO_DTYPE", raising=False)
    if dtype:
        monkeypatch.setenv("DAYZERO_DTYPE", dtype)
    assert cli.main(["inspect", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model = load_model(checkpoint, torch_dtype, progress=False)
    held = sum(t.nbytes for t in model.state_dict().values())  # (the fp32 ones and the buffers too)
    assert report["memory_gib"]["packed_weights"] == pytest.approx(held / (1 << 30), rel=0.01)
    assert report["plan"]["dense"] == f"{dtype or 'float32'} (DAYZERO_DTYPE)"  # float weights: no FP8 to dequantize


def test_a_tiny_model_s_counts_are_not_rounded_to_nothing(tiny_checkpoint):
    """A model of 437,677 parameters was "437,677 (0.00 B)": the count in billions alone."""
    from dayzero.quant.inspect import render

    report = inspect(tiny_checkpoint)
    total, active = render(report).splitlines()[:2]
    assert report.total_params < 1e6 and total.endswith(f"({report.total_params / 1e3:.2f} K)")
    assert active.startswith(f"active per token   {report.active_params:,} ({report.active_params / 1e3:.2f} K; ")


@pytest.mark.parametrize("speculative", [0, 2])
def test_the_plan_holds_the_mtp_layer_the_checkpoint_ships(speculative, mtp_checkpoint, monkeypatch, capsys):
    """The plan left the MTP layer out (transformers' count does not build it), while the loader holds
    its weights whenever the checkpoint ships it (V4-Flash's: 6.6B parameters, a whole MoE layer) and
    each sequence holds its window and pending streams under speculative decoding."""
    from safetensors.torch import load_file

    monkeypatch.delenv("DAYZERO_DTYPE", raising=False)  # float32: the tiny checkpoint's own dtype
    monkeypatch.setenv("DAYZERO_SPECULATIVE_TOKENS", str(speculative))
    monkeypatch.setenv("DAYZERO_BLOCK_SIZE", "4")  # (the plan's blocks were 64 rows whatever it said)
    assert cli.main(["inspect", str(mtp_checkpoint), "--json", "--batch", "3"]) == 0
    mtp = json.loads(capsys.readouterr().out)["mtp"]
    tensors = {k: t for k, t in load_file(mtp_checkpoint / "model.safetensors").items() if k.startswith("mtp.")}
    # every mtp.* tensor stored (float32) is held; the routing correction bias is a buffer, out of every count
    shipped = sum(t.nbytes for t in tensors.values())
    params = sum(t.numel() for k, t in tensors.items() if not k.endswith("gate.bias"))
    assert tensors and mtp["layers"] == 1 and mtp["weight_bytes"] == shipped
    config = json.loads((mtp_checkpoint / "config.json").read_text())
    window_rows = -(-(config["sliding_window"] - 1) // 4) * 4  # the ring's whole blocks of DAYZERO_BLOCK_SIZE rows
    streams = config["hc_mult"] * config["hidden_size"]  # the hyper-connection streams the MTP layer reads next
    state = (window_rows * config["head_dim"] + streams) * 4 if speculative else 0
    assert mtp["state_bytes_per_sequence"] == state
    report = cli.main(["inspect", str(mtp_checkpoint)]) == 0 and capsys.readouterr().out
    assert f"MTP layers         1: {params:,} parameters" in report


def test_a_kv_budget_over_what_fits_raises_the_h200s_needed(capsys):
    """The plan left DAYZERO_KV_BUDGET_MB out: V4-Flash at a 64 GiB budget needed "2" H200s, while each
    worker allocates the whole budget: 140 GiB of FP4 experts over 2 devices and 28 GiB of the rest
    (float32) is 98 GiB each, and 64 more is past an H200's 131.3 GiB."""
    from dayzero.settings import Settings

    small = inspect("deepseek-v4-flash", settings=Settings(kv_budget_mb=4096))
    assert small.plan["h200s_needed"] == 2 and small.memory_gib["attention_pools"] == pytest.approx(4, abs=0.01)
    large = inspect("deepseek-v4-flash", settings=Settings(kv_budget_mb=64 << 10))
    assert large.memory_gib["attention_pools"] == pytest.approx(64, abs=0.01)
    needed = large.plan["h200s_needed"]
    assert (
        needed > 2
        and inspect("deepseek-v4-flash", devices=needed, settings=Settings(kv_budget_mb=64 << 10)).plan["fits_one_h200"]
    )
    fewer = max(n for n in range(1, needed) if 256 % n == 0)  # the next count --devices takes below it
    assert not inspect("deepseek-v4-flash", devices=fewer, settings=Settings(kv_budget_mb=64 << 10)).plan[
        "fits_one_h200"
    ]


def test_the_kv_pools_line_says_what_attention_pools_counts(monkeypatch, capsys):
    """A budget of 256 MiB cannot hold 16 of V4-Flash's windows (a worker refuses to start), while the
    default holds them; a budget under --batch's state is what --batch needs, not what is counted;
    decode graphs' own memory is out."""
    assert cli.main(["inspect", "deepseek-v4-flash"]) == 0
    held = "16 sequences' windows and one sequence of 65536 tokens"
    assert f"bytes a worker allocates (a budget of the least that holds {held}" in capsys.readouterr().out
    monkeypatch.setenv("DAYZERO_KV_BUDGET_MB", "256")
    assert cli.main(["inspect", "deepseek-v4-flash"]) == 0
    assert "KV pools           none: a worker refuses to start (DAYZERO_KV_BUDGET_MB=256 cannot hold" in (
        capsys.readouterr().out
    )
    for name, value in {"DAYZERO_KV_BUDGET_MB": "4096", "DAYZERO_DEVICE": "cuda"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DAYZERO_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("DAYZERO_DECODE_GRAPHS", "1")
    assert cli.main(["inspect", "deepseek-v4-flash", "--batch", "8", "--context", "1000000"]) == 0
    out = capsys.readouterr().out
    assert "bytes a worker allocates (a budget of DAYZERO_KV_BUDGET_MB=4096, windows for 17 sequences)" in out
    assert "of --batch 8 at --context 1000000, which attention_pools counts" in out
    assert "the graphs' own memory (each captured bucket's activations and logits) is not in the plan" in out


def test_the_plan_builds_the_model_s_skeleton_once(monkeypatch):
    """It was built four times a plan (~0.15 s each for V4-Flash), and again for each group size a
    --tensor-parallel plan tried: seven for Flash's."""
    from dayzero.quant import memory_plan

    built = []
    monkeypatch.setattr(memory_plan, "skeleton", lambda *a, **k: built.append(1) or skeleton(*a, **k))
    inspect("deepseek-v4-flash", tensor_parallel=8)
    assert len(built) == 1
