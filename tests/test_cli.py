"""The three commands, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from dayzero import cli
from dayzero.kernels import attention


def _dayzero(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dayzero.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_demo_checkpoint_generate_and_align(tmp_path):
    out = tmp_path / "demo"
    made = _dayzero("demo-checkpoint", str(out), "--seed", "3")
    assert made.returncode == 0, made.stderr
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    }
    gen = _dayzero("generate", "--checkpoint", str(out), "--prompt-ids", "0,5,6,7", "--max-tokens", "6", "--stats")
    assert gen.returncode == 0, gen.stderr
    stats = json.loads(gen.stdout.strip().splitlines()[-1])
    assert stats["prompt_tokens"] == 4 and stats["completion_tokens"] == 6
    assert stats["prefill_tokens_per_s"] > 0 and stats["decode_tokens_per_s"] > 0
    al = _dayzero("align", str(out), "--tokens", "4", "--json")
    assert al.returncode == 0, al.stderr
    report = json.loads(al.stdout)
    assert report["greedy_match"] and report["max_abs_err"] < 1e-4 and len(report["steps"]) == 4
    assert len(report["layers"]) == 4 and max(report["layers"]) < 1e-4
    assert report["sparse_vs_dense_max_abs"] > 0  # demo: top-k 4 < entries of a 64-token prompt


def test_align_fails_with_exit_1_when_beyond_tolerance(tiny_checkpoint, monkeypatch, capsys):
    real = attention.sparse_attention_torch

    def sinkless(q, kv, batch, window, table, size, sink, compressed):  # a plausible bug: the sink forgotten
        return real(q, kv, batch, window, table, size, torch.full_like(sink, -1e9), compressed)

    monkeypatch.setattr(attention, "sparse_attention_torch", sinkless)
    assert cli.main(["align", str(tiny_checkpoint), "--tokens", "2", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_bad_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["generate", "--checkpoint", str(tmp_path), "--prompt-ids", "1,2"]) == 2
    assert "error:" in capsys.readouterr().err


def test_help_explains_each_command():
    out = _dayzero("generate", "--help").stdout
    assert "--prompt-ids" in out and "--stats" in out and "greedy" in out


def test_up_and_serve_help_list_every_setting():
    from dayzero.settings import Settings

    for command in ("up", "serve"):
        out = _dayzero(command, "--help").stdout
        missing = [name for name in Settings.model_fields if f"DAYZERO_{name.upper()}" not in out]
        assert not missing, (command, missing)
    assert "DAYZERO_DEVICE" in out and "cuda_ipc" in out
