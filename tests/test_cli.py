"""The three commands, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dayzero import cli
from dayzero.kernels import attention

from .conftest import run_dayzero
from .transformers_logs import shown_warnings, transformers_loggers_on_closed_streams


@pytest.mark.slow
def test_demo_checkpoint_generate_and_align(tmp_path, transformers_logs, capsys, recwarn):
    """In this process (cli.main, as ``python -m dayzero.cli`` calls it): a process each paid torch's
    and transformers' imports three times (the commands' own processes run in other tests)."""
    out = tmp_path / "demo"
    assert cli.main(["demo-checkpoint", str(out), "--seed", "3"]) == 0, capsys.readouterr().err
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    }
    capsys.readouterr()
    gen = cli.main(["generate", "--checkpoint", str(out), "--prompt-ids", "0,5,6,7", "--max-tokens", "6", "--stats"])
    printed = capsys.readouterr()
    assert gen == 0, printed.err
    stats = json.loads(printed.out.strip().splitlines()[-1])
    assert stats["prompt_tokens"] == 4 and stats["completion_tokens"] == 6
    assert stats["prefill_tokens_per_s"] > 0 and stats["decode_tokens_per_s"] > 0
    al = cli.main(["align", str(out), "--tokens", "4", "--json"])
    printed = capsys.readouterr()
    assert al == 0, printed.err
    report = json.loads(printed.out)
    assert report["greedy_match"] and report["max_abs_err"] < 1e-4 and len(report["steps"]) == 4
    assert len(report["layers"]) == 4 and max(report["layers"]) < 1e-4
    assert report["sparse_vs_dense_max_abs"] > 0  # demo: top-k 4 < entries of a 64-token prompt
    assert shown_warnings(recwarn) == []  # on a process's stderr, which the assertions above read


def test_transformers_still_logs_after_the_commands_above_ran_in_this_process(transformers_logs):
    """(After the test above, as the file runs:) its commands' transformers logged to its capsys
    stream, closed with it: every later warning in the worker was a "--- Logging error ---"."""
    assert transformers_loggers_on_closed_streams(transformers_logs) == []


def test_align_fails_with_exit_1_when_beyond_tolerance(tiny_checkpoint, monkeypatch, capsys):
    real = attention.sparse_attention_torch

    def sinkless(q, kv, batch, window, table, size, sink, compressed):  # a plausible bug: the sink forgotten
        return real(q, kv, batch, window, table, size, torch.full_like(sink, -1e9), compressed)

    monkeypatch.setattr(attention, "sparse_attention_torch", sinkless)
    assert cli.main(["align", str(tiny_checkpoint), "--tokens", "2", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ("a,b", "--prompt-ids takes comma-separated integers, got 'a,b'"),
        (",", "--prompt-ids is empty"),
        ("1 2", "--prompt-ids takes comma-separated integers, got '1 2'"),  # was token 12
        ("1_0", "--prompt-ids takes comma-separated integers, got '1_0'"),  # was token 10
    ],
)
def test_bad_prompt_ids_are_input_errors_like_any_other(tiny_checkpoint, ids, message, capsys):
    assert cli.main(["generate", "--checkpoint", str(tiny_checkpoint), "--prompt-ids", ids]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_align_refuses_decode_steps_past_the_model_s_context(tiny_checkpoint, capsys, monkeypatch):
    from dayzero import align

    monkeypatch.setattr(align, "align", lambda *args: pytest.fail("align ran"))
    assert cli.main(["align", str(tiny_checkpoint), "--prompt-ids", "1,2", "--tokens", "8191"]) == 2
    expected = "error: 2 prompt tokens and --tokens 8191 are past the model's context (max_position_embeddings 8192)\n"
    assert capsys.readouterr().err == expected


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["--top-p", "2"], "--top-p must be in [0, 1]"),
    ],
)
def test_a_sampling_option_out_of_range_is_named_as_an_option(tiny_checkpoint, option, message, capsys):
    """(The sampling contract names its fields: max_tokens, top_p.)"""
    assert cli.main(["generate", "--checkpoint", str(tiny_checkpoint), "--prompt-ids", "1", *option]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("prompt", [["--prompt-ids", "1,2"], ["--prompt", "hi"], ["--prompt", "hi", "--stop", "x"]])
def test_a_directory_without_a_config_is_named_so(prompt, tmp_path, capsys):
    """(A text prompt was told "this checkpoint has no tokenizer.json: send the prompt as token ids".)"""
    assert cli.main(["generate", "--checkpoint", str(tmp_path), *prompt]) == 2
    assert capsys.readouterr().err == f"error: no config.json at {tmp_path / 'config.json'}\n"


def test_ctrl_c_ends_a_command_in_one_line_with_exit_130():
    """Ctrl-C during generate, quantize or train-demo printed KeyboardInterrupt's traceback."""
    code = (
        "import sys; from dayzero import cli\n"
        "def interrupted(args, settings): raise KeyboardInterrupt\n"
        "cli.cmd_inspect = interrupted; sys.exit(cli.main(['inspect', 'deepseek-v4-flash']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "\ninterrupted\n")


def test_help_explains_each_command():
    out = run_dayzero("generate", "--help").stdout
    assert "--prompt-ids" in out and "--stats" in out and "greedy" in out


def test_bad_settings_are_one_line_errors():
    import os

    env = {**os.environ, "DAYZERO_MAX_BATCH": "many"}
    out = run_dayzero("generate", "--prompt-ids", "1,2", env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr  # as every other input error
    assert out.stderr.strip().startswith("error: DAYZERO_MAX_BATCH='many'") and len(out.stderr.splitlines()) == 1


def test_image_hosts_are_comma_separated_like_api_keys(monkeypatch, capsys):
    monkeypatch.setenv("DAYZERO_IMAGE_ALLOWED_HOSTS", "a.com,b.com")
    assert cli.main(["inspect", "deepseek-v4-flash", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_params"] == 284_325_869_015


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`dayzero ... | head -c 1`: no BrokenPipeError traceback when the reader has gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dayzero.cli", "inspect", "deepseek-v4-flash"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # gone before the command writes a line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == ""


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "--prompt-ids", "1"],
        ["serve", "decode"],
        ["up", "--log-dir", "{logs}"],
    ],
)
def test_a_cuda_device_the_host_lacks_is_refused_before_any_work(command, tmp_path, capsys, monkeypatch):
    from dayzero import cli_services, stack

    monkeypatch.setenv("DAYZERO_DEVICE", "cuda")
    monkeypatch.setenv("DAYZERO_HANDOFF", "redis")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    monkeypatch.setattr(cli_services, "_run_worker", lambda *a: pytest.fail("serve started a worker"))
    assert cli.main([a.format(logs=tmp_path / "logs") for a in command]) == 2
    assert capsys.readouterr().err == "error: DAYZERO_DEVICE=cuda but CUDA is not available on this host\n"


def test_version_and_the_help_of_every_option_with_a_default():
    from importlib.metadata import version

    assert run_dayzero("--version").stdout == f"dayzero {version('dayzero')}\n"
    serve, up = (" ".join(run_dayzero(command, "--help").stdout.split()) for command in ("serve", "up"))
    assert "the HTTP gateway, or the vision, prefill or decode stage's worker" in serve
    assert "(default 0: wait as long as it takes)" in up
    assert run_dayzero("up", "--ready-timeout", "-1").returncode == 2


@pytest.mark.parametrize(
    "command",
    [
        ["up", "--decode-tp", "2", "--log-dir", "{logs}"],
        ["generate", "--tensor-parallel", "2", "--prompt", "hi"],
        ["inspect", "{model}", "--tensor-parallel", "2"],
    ],
)
def test_a_split_the_loader_would_refuse_is_refused_before_any_rank_starts(command, tmp_path, capsys, monkeypatch):
    """The built-in model's FP8 weights are 64 rows where a split needs whole 128-row blocks: `up`
    crash-looped its decode group, `generate` started its ranks first, `inspect` said it fits."""
    from dayzero import stack
    from dayzero.parallel import group
    from dayzero.settings import BUILT_IN_MODEL

    monkeypatch.setattr(stack.Stack, "start", lambda self: pytest.fail("up started a stack"))
    monkeypatch.setattr(group, "run_group", lambda *a, **k: pytest.fail("generate started its ranks"))
    argv = [part.format(logs=tmp_path / "logs", model=BUILT_IN_MODEL) for part in command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "over 2 ranks is 32 per rank, not a whole number of 128-row FP8 blocks" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--group-timeout", "0", "--prompt", "x"], "--group-timeout: must be a number above 0, got 0"),
        (["align", "--tokens", "0"], "--tokens: must be at least 1, got 0"),
    ],
)
def test_counts_and_timeouts_below_their_range_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("notaurl", ""),
        ("http://", ""),
        ("http://127.0.0.1:99999", ""),
        ("http://127.0.0.1:abc", " (Invalid port: 'abc')"),  # httpx's traceback before
        ("http://256.256.256.256:8000", " (Invalid IPv4 address: '256.256.256.256')"),
    ],
)
def test_doctor_takes_only_an_http_url(url, why, capsys):
    assert cli.main(["doctor", url]) == 2
    assert capsys.readouterr().err == f"error: {url!r} is not a gateway URL such as http://127.0.0.1:8000{why}\n"
