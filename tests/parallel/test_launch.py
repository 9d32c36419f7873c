"""Joining a group as one rank: torchrun's variables read into a ``Launch``, what is refused before
any rank is waited for, and a rendezvous that fails within the group timeout."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import torch

from dayzero import cli
from dayzero.parallel import ParallelConfig, ParallelError
from dayzero.parallel.launch import Launch, launch_from
from dayzero.procs import free_port

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchruns_variables_name_this_rank_and_its_device():
    assert launch_from({"MASTER_ADDR": "10.0.0.1"}, "cpu") is None  # no RANK, no WORLD_SIZE: local ranks
    cpu = launch_from(TORCHRUN, "cpu")
    assert cpu == Launch(ParallelConfig(2, 1), 1, master_addr="10.0.0.1", master_port=29500) and cpu.backend == "gloo"
    assert cpu.device == torch.device("cpu")
    gpu = launch_from(TORCHRUN, "cuda")
    assert gpu.backend == "nccl" and gpu.device == torch.device("cuda", 1)  # its host's GPU LOCAL_RANK


def test_incomplete_or_wrong_variables_are_refused():
    with pytest.raises(ParallelError, match="not set: LOCAL_RANK, MASTER_ADDR, MASTER_PORT"):
        launch_from({"RANK": "0", "WORLD_SIZE": "2"}, "cpu")
    with pytest.raises(ParallelError, match="rank 2 of 2 ranks"):
        launch_from({**TORCHRUN, "RANK": "2"}, "cpu")
    with pytest.raises(ParallelError, match="must be integers"):
        launch_from({**TORCHRUN, "MASTER_PORT": "http"}, "cpu")
    for port in ("70000", "0", "-5"):  # 70000: torch's own "port must have value from 0 to 65535", no name
        with pytest.raises(ParallelError, match=rf"^MASTER_PORT must be a port number, 1 to 65535; got {port} "):
            launch_from({**TORCHRUN, "MASTER_PORT": port}, "cpu")
    with pytest.raises(ParallelError, match="LOCAL_RANK must be 0 or more; got -1"):
        launch_from({**TORCHRUN, "LOCAL_RANK": "-1"}, "cpu")


def test_generate_refuses_a_group_of_another_size(tiny_checkpoint, monkeypatch, capsys):
    for name, value in {**TORCHRUN, "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    args = ["generate", "--checkpoint", str(tiny_checkpoint), "--prompt-ids", "1,2", "--max-tokens", "2"]
    assert cli.main(args) == 2  # --tensor-parallel 1 under a group of 2
    assert "WORLD_SIZE is 2 (ranks started by torchrun" in capsys.readouterr().err
    assert cli.main([*args, "--tensor-parallel", "2", "--temperature", "0.7"]) == 2  # no seed to agree on
    assert capsys.readouterr().err.strip().endswith("sample alike only with one --seed: pass --seed")


def _rank_alone(rank: int, master_addr: str, port: int, timeout: float, tiny_checkpoint) -> subprocess.CompletedProcess:
    """``generate`` as ``rank`` of 2 meeting at ``master_addr``:``port``, the other rank never started."""
    env = {**os.environ, **TORCHRUN, "RANK": str(rank), "LOCAL_RANK": "0", "MASTER_ADDR": master_addr}
    env["MASTER_PORT"] = str(port)
    args = ["generate", "--checkpoint", str(tiny_checkpoint), "--prompt-ids", "1,2", "--tensor-parallel", "2"]
    command = [sys.executable, "-m", "dayzero.cli", *args, "--group-timeout", f"{timeout:g}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_rank_whose_peers_never_come_fails_within_the_timeout(tiny_checkpoint):
    """In a process of its own: a failed rendezvous leaves torch's count of process groups raised,
    so this process's later groups would be named unlike their spawned peers'."""
    done = _rank_alone(0, "127.0.0.1", free_port(), 2, tiny_checkpoint)
    assert done.returncode != 0
    assert re.search(r"Timed out after [23] seconds waiting for clients\. 1/2 clients joined", done.stderr)


@pytest.mark.slow
def test_a_master_port_in_use_is_named_not_waited_out(tiny_checkpoint):
    """Rank 0 serves the rendezvous at MASTER_PORT: another process holding it failed the start at
    once, but the error said the group "did not meet within 60 s" and asked whether the other
    ranks had the same MASTER_PORT. It names the port in use."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _rank_alone(0, "127.0.0.1", port, 60, tiny_checkpoint)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: rank 0 of 2 cannot serve the group's rendezvous at 127.0.0.1:{port}: another process holds "
        f"that port on this host; choose another MASTER_PORT (torchrun: --master-port)"
    )


@pytest.mark.slow
def test_a_master_addr_that_does_not_resolve_is_refused_at_once(tiny_checkpoint):
    """A typo in MASTER_ADDR's host name: torch's store retried it until the group timeout (600 s
    here: past the run's 120 s bound) and reported a timeout. It is named at the start."""
    done = _rank_alone(1, "rank0-host.invalid", 29500, 600, tiny_checkpoint)
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("error: MASTER_ADDR 'rank0-host.invalid' does not resolve to an address (")


@pytest.mark.slow
def test_a_rank_whose_rank_0_never_serves_says_so_in_one_line(tiny_checkpoint):
    """Rank 1 waits for the rendezvous store rank 0 serves: torch's own failed connect logged each try
    with ~40 lines of C++ frames before the error. Only the error is printed."""
    port = free_port()  # nobody serves it
    done = _rank_alone(1, "127.0.0.1", port, 2, tiny_checkpoint)
    assert done.returncode == 1
    assert "frame #" not in done.stderr and "TCPStore" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: rank 1 of 2: the group did not meet at 127.0.0.1:{port} within 2 s (no rendezvous "
        f"store answered: Connection refused); are the other ranks started with the same MASTER_ADDR and MASTER_PORT?"
    )
