"""A group restarted by torchrun (``--max-restarts``) meets again: torchrun's agent on rank 0's host
serves one rendezvous store for every attempt (static rendezvous keeps it), and the ranks of the
new attempt must not meet what the dead one left there, whatever each host's count of attempts.

The agent's part is played here (the store, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT
as torchrun sets them); every rank is a real process joining through ``run_group(launch=...)``.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from dayzero.procs import free_port

RANK_SUM = """
import os, torch
from dayzero.parallel.group import run_group
from dayzero.parallel.launch import launch_from
def total(group):
    return int(group.all_reduce_sum(torch.full((1,), group.config.rank + 1.0)).item())
launch = launch_from(os.environ, "cpu")
print(run_group(launch.config.world_size, total, launch=launch, timeout=float(os.environ["GROUP_TIMEOUT_S"])))
"""
JOINED_FIRST = "dayzero/meeting1/rank1"  # rank 1's starts that found the first meeting (the newest) there
RUN_S = 90  # a rank that has not exited by then has hung (the group timeout: 30 s)


def _rank(
    rank: int, attempt: int, port: int, timeout: float = 30, world_size: int = 2, script: str = RANK_SUM
) -> subprocess.Popen:
    env = {
        **os.environ,
        "GROUP_TIMEOUT_S": str(timeout),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
    }
    env |= {"MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)  # as torchrun's agent sets them
    argv = [sys.executable, "-c", script]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _results(ranks: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    try:
        return [(rank.wait(timeout=RUN_S), rank.stdout.read(), rank.stderr.read()) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
            rank.stdout.close()
            rank.stderr.close()


def _agent_store(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(60))


@pytest.mark.slow
def test_a_restarted_group_meets_again_on_the_agents_store():
    """Attempt 1's rank 1 starting before its rank 0 (as when rank 1 was the one killed: its agent
    restarts it at once, rank 0's only once rank 0 has failed too) read attempt 0's rank 0 gloo
    address from the store, connected to a process long gone and failed: the restarted group never
    served. Each attempt meets under its own name now."""
    port = free_port()
    agent = _agent_store(port)
    first = _results([_rank(0, 0, port), _rank(1, 0, port)])
    assert [(code, out) for code, out, _ in first] == [(0, "3\n"), (0, "3\n")], first
    follower = _rank(1, 1, port)
    deadline = time.monotonic() + RUN_S
    while agent.add(JOINED_FIRST, 0) < 2 and follower.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until rank 1 has reached the store (or failed there): then rank 0 starts
    second = _results([_rank(0, 1, port), follower])
    assert [(code, out) for code, out, _ in second] == [(0, "3\n"), (0, "3\n")], second[1][2][-3000:]


@pytest.mark.slow
def test_a_host_whose_torchrun_started_again_alone_meets_the_others():
    """Host 1 rebooted (its torchrun counts from 0 again) while host 0's agent restarted its rank 0
    (count 1): the ranks met under their own host's count, attempt 1 and attempt 0, never; rank 1
    read the dead attempt 0's rank 0 address and failed. The other way round (host 0's torchrun,
    and the store with it, started again alone: a fresh store, rank 0 at count 0, rank 1 at 1) they
    waited out the group timeout. Each start of rank 0 opens a meeting in the store now."""
    port = free_port()
    agent = _agent_store(port)
    first = _results([_rank(0, 0, port), _rank(1, 0, port)])
    assert [(code, out) for code, out, _ in first] == [(0, "3\n"), (0, "3\n")], first
    again = _results([_rank(0, 1, port), _rank(1, 0, port)])
    assert [(code, out) for code, out, _ in again] == [(0, "3\n"), (0, "3\n")], again[1][2][-3000:]
    del agent
    port = free_port()
    agent = _agent_store(port)
    fresh = _results([_rank(0, 0, port), _rank(1, 1, port)])
    assert [(code, out) for code, out, _ in fresh] == [(0, "3\n"), (0, "3\n")], fresh[1][2][-3000:]
    del agent


@pytest.mark.slow
def test_a_rank_whose_rank_0_never_starts_again_is_told_why():
    """A restarted rank 1 finds the store's newest meeting joined by its dead self already and waits
    for rank 0 to open the next one: within the group timeout, or it says that this is what it waited for."""
    port = free_port()
    agent = _agent_store(port)
    first = _results([_rank(0, 0, port), _rank(1, 0, port)])
    assert [code for code, _, _ in first] == [0, 0], first
    [(code, _, err)] = _results([_rank(1, 1, port, timeout=3)])
    assert code == 1, err[-3000:]
    assert (
        f"rank 1 of 2: the group did not meet at 127.0.0.1:{port} within 3 s (rank 0 started no new meeting of "
        "the group (meeting 1 joined by rank 1 already))" in err
    ), err[-3000:]
    del agent
