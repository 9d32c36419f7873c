"""``align``, ``generate`` and ``inspect`` with ``--tensor-parallel N``, as a user runs them."""

from __future__ import annotations

import json

import pytest

from dayzero import cli
from dayzero.parallel import ParallelError
from dayzero.quant.inspect import inspect
from dayzero.settings import Settings

from .test_tensor_parallel import TP4


def test_align_on_two_ranks_passes_against_transformers(checkpoint_factory, capsys):
    path = checkpoint_factory("tp4", **TP4)
    assert cli.main(["align", str(path), "--tokens", "4", "--json", "--tensor-parallel", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["greedy_match"] and len(report["steps"]) == 4
    assert report["max_abs_err"] < 1e-4 and max(report["layers"]) < 1e-4


def test_generate_on_two_ranks_prints_what_one_rank_prints(checkpoint_factory, capsys):
    path = checkpoint_factory("tp4", **TP4)
    args = ["generate", "--checkpoint", str(path), "--prompt-ids", "3,14,15,92,65,35", "--max-tokens", "8"]
    assert cli.main(args) == 0
    single = capsys.readouterr().out
    assert cli.main([*args, "--tensor-parallel", "2"]) == 0
    assert capsys.readouterr().out == single and len(single.split(",")) == 8


def test_inspect_prints_per_rank_bytes_and_the_smallest_group():
    # as the peers serve Pro (float32 needs more)
    bf16 = {"batch": 8, "context": 65536, "settings": Settings(dtype="bfloat16")}
    one = inspect("deepseek-v4-pro", **bf16)
    eight = inspect("deepseek-v4-pro", tensor_parallel=8, **bf16)
    tp = eight.tensor_parallel
    # the experts split 8 ways; the attention state is every rank's whole (replicated)
    assert tp["gib_per_rank"]["routed_experts"] * 8 == pytest.approx(one.memory_gib["packed_weights"], rel=0.05)
    assert tp["gib_per_rank"]["attention_state_replicated"] == pytest.approx(one.memory_gib["attention_pools"])
    assert tp["fits_h200"] and tp["smallest_fitting_h200_group"] == 8  # peers serve Pro on 8 H200
    flash = inspect("deepseek-v4-flash", tensor_parallel=2, **bf16).tensor_parallel
    assert flash["smallest_fitting_h200_group"] == 2 and flash["fits_h200"]
    with pytest.raises(ParallelError, match="cannot be split over 3 ranks"):
        inspect("deepseek-v4-flash", tensor_parallel=3)


def test_inspect_command_says_the_state_is_replicated(capsys):
    assert cli.main(["inspect", "deepseek-v4-flash", "--tensor-parallel", "4"]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel 4" in out and "replicated: every rank holds every sequence's whole state" in out
    assert "smallest tensor-parallel group that fits on H200s: 2" in out


def test_serve_refuses_groups_it_cannot_run_before_starting_anything(checkpoint_factory, monkeypatch, capsys):
    """Each refusal comes before a rank, a Redis connection or a weight is touched."""
    monkeypatch.setenv("DAYZERO_CHECKPOINT", str(checkpoint_factory("tiny")))
    assert cli.main(["serve", "decode", "--tensor-parallel", "4"]) == 2
    assert "o_groups 2 cannot be split over 4 ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["up", "--decode-tp", "0"])
    assert "--decode-tp: must be at least 1, got 0" in capsys.readouterr().err
    assert cli.main(["serve", "vision", "--tensor-parallel", "2"]) == 2
    assert "--tensor-parallel is for prefill and decode workers" in capsys.readouterr().err
    monkeypatch.setenv("DAYZERO_SPECULATIVE_TOKENS", "1")
    assert cli.main(["serve", "decode", "--tensor-parallel", "2"]) == 2
    assert "DAYZERO_SPECULATIVE_TOKENS runs on one rank" in capsys.readouterr().err
    monkeypatch.delenv("DAYZERO_SPECULATIVE_TOKENS")
    torchrun = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["serve", "decode", "--tensor-parallel", "2"]) == 2
    err = capsys.readouterr().err
    assert "WORLD_SIZE is 4" in err and "--tensor-parallel is 2" in err


def test_serve_gateway_refuses_tensor_parallel_before_it_serves(monkeypatch, capsys):
    """``serve gateway --tensor-parallel 2`` served on, the flag ignored (``serve vision`` refused it)."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the gateway served"))
    monkeypatch.setenv("DAYZERO_REDIS_URL", "redis://127.0.0.1:1/0")  # (nothing to reach: none is asked)
    assert cli.main(["serve", "gateway", "--tensor-parallel", "2"]) == 2
    assert "--tensor-parallel is for prefill and decode workers; the gateway runs no model" in capsys.readouterr().err


def test_a_tensor_parallel_setting_for_every_service_starts_the_gateway_and_vision(monkeypatch):
    """Compose's one environment for every worker with DAYZERO_TENSOR_PARALLEL=4 (ranks per prefill /
    decode worker): vision was refused, exit 2 for ever under restart, naming a --tensor-parallel its
    command never gave; the gateway serves (the flag alone is refused)."""
    import uvicorn

    from dayzero import cli_services

    class Started(Exception):
        pass

    def started(*a, **k):
        raise Started

    monkeypatch.setenv("DAYZERO_TENSOR_PARALLEL", "4")
    monkeypatch.setattr(cli_services, "_gateway_redis_refusal_checked", lambda url: None)
    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr(cli_services, "_run_worker", started)
    for service in ("gateway", "vision"):
        with pytest.raises(Started):
            cli.main(["serve", service])


def test_ranks_that_do_not_meet_are_one_line_not_a_traceback(checkpoint_factory, tmp_path):
    """Rank 0 of 2 under torchrun's variables, rank 1 never started: one line naming the address
    and the timeout, exit 1 (it was torch's 33-line DistStoreError traceback)."""
    import os
    import subprocess
    import sys

    from dayzero.procs import free_port

    path, port = checkpoint_factory("tp4", **TP4), free_port()
    rank0 = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    argv = [
        "generate",
        "--checkpoint",
        str(path),
        "--prompt-ids",
        "3,14",
        "--tensor-parallel",
        "2",
        "--group-timeout",
        "3",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "dayzero.cli", *argv],
        env={**os.environ, **rank0},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: rank 0 of 2: the group did not meet at 127.0.0.1:{port} within 3 s"
    )


@pytest.mark.parametrize("group", ["flag", "torchrun", "torchrun of one"])
def test_serve_decode_refuses_decode_graphs_in_a_group(group, monkeypatch, capsys):
    """DAYZERO_DECODE_GRAPHS with DAYZERO_TENSOR_PARALLEL=2 was refused, with ``serve decode --tensor-parallel
    2`` (or under torchrun) it started: rank 0's warm-up captures the graphs of steps that all-reduce
    while the other ranks wait in a broadcast for its next message. Refused before the device is looked
    at; a prefill group, whose steps no graph replays, is not, nor a torchrun of one rank (WORLD_SIZE=1:
    no collective, no follower; it was refused "runs on one rank")."""
    from dayzero.settings import Settings

    def device_looked_at(settings) -> None:
        raise ValueError("the device was looked at")

    monkeypatch.setattr(Settings, "require_device", device_looked_at)
    graphs = {"DAYZERO_DEVICE": "cuda", "DAYZERO_ATTENTION_BACKEND": "triton", "DAYZERO_DECODE_GRAPHS": "1"}
    world = "1" if group == "torchrun of one" else "2"
    torchrun = {"RANK": "0", "WORLD_SIZE": world, "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in {**graphs, **(torchrun if group.startswith("torchrun") else {})}.items():
        monkeypatch.setenv(name, value)
    flag = ["--tensor-parallel", "2"] if group == "flag" else []
    assert cli.main(["serve", "decode", *flag]) == 2
    refused = "DAYZERO_DECODE_GRAPHS runs on one rank" if world == "2" else "the device was looked at"
    assert f"error: {refused}" in capsys.readouterr().err
    assert cli.main(["serve", "prefill", *flag]) == 2
    assert "error: the device was looked at" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "flag", "refusal"),
    [
        ("DAYZERO_DECODE_GRAPHS", "--decode-tp", "DAYZERO_DECODE_GRAPHS runs on one rank"),
        ("DAYZERO_SPECULATIVE_TOKENS", "--prefill-tp", "DAYZERO_SPECULATIVE_TOKENS runs on one rank"),
        ("DAYZERO_DECODE_GRAPHS", "--prefill-tp", None),  # a prefill group replays no graph
    ],
)
def test_up_refuses_a_group_its_worker_would_refuse_before_the_stack_starts(
    env, flag, refusal, checkpoint_factory, tmp_path, monkeypatch, capsys
):
    """``up --decode-tp 2`` with DAYZERO_DECODE_GRAPHS (or a group with DAYZERO_SPECULATIVE_TOKENS)
    started the stack: its worker's ``serve --tensor-parallel 2`` exited 2 at each start, restarted
    until up gave up ("keeps exiting while starting"). Refused as the worker refuses, before the stack."""
    from dayzero import stack
    from dayzero.settings import Settings

    def started(self) -> None:
        raise ValueError("the stack started")

    monkeypatch.setattr(Settings, "require_device", lambda settings: None)  # (the check is before it)
    monkeypatch.setattr(stack.Stack, "start", started)
    for name, value in {"DAYZERO_DEVICE": "cuda", "DAYZERO_ATTENTION_BACKEND": "triton", env: "1"}.items():
        monkeypatch.setenv(name, value)
    ckpt, logs = checkpoint_factory("tiny"), tmp_path / "logs"
    capsys.readouterr()  # (the checkpoint's writing, when this test made it)
    assert cli.main(["up", "--checkpoint", str(ckpt), flag, "2", "--log-dir", str(logs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {refusal or 'the stack started'}"), err
    assert logs.exists() == (refusal is None)
