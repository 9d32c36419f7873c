"""A group restarted by torchrun (``--max-restarts``) meets again: torchrun's agent on rank 0's host
serves one rendezvous store for every attempt (static rendezvous keeps it), and the ranks of the
new attempt must not meet what the dead one left there.

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

from dayzero.parallel.group import free_port

RANK_SUM = """
import os, torch
from dayzero.parallel.group import run_group
from dayzero.parallel.launch import launch_from
def total(group):
    return int(group.all_reduce_sum(torch.full((1,), group.config.rank + 1.0)).item())
print(run_group(2, total, launch=launch_from(os.environ, "cpu"), timeout=float(os.environ["GROUP_TIMEOUT_S"])))
"""
RUN_S = 90  # a rank that has not exited by then has hung (the group timeout: 30 s)


def _rank(rank: int, attempt: int, port: int, timeout: float = 30) -> subprocess.Popen:
    env = {
        **os.environ,
        "GROUP_TIMEOUT_S": str(timeout),
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
    }
    env |= {"MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)  # as torchrun's agent sets them
    argv = [sys.executable, "-c", RANK_SUM]
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


@pytest.mark.slow
def test_a_restarted_group_meets_again_on_the_agents_store():
    """Attempt 1's rank 1 starting before its rank 0 (as when rank 1 was the one killed: its agent
    restarts it at once, rank 0's only once rank 0 has failed too) read attempt 0's rank 0 gloo
    address from the store, connected to a process long gone and failed: the restarted group never
    served. Each attempt meets under its own name now."""
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(60))
    first = _results([_rank(0, 0, port), _rank(1, 0, port)])
    assert [(code, out) for code, out, _ in first] == [(0, "3\n"), (0, "3\n")], first
    keys = agent.num_keys()
    follower = _rank(1, 1, port)
    deadline = time.monotonic() + RUN_S
    while agent.num_keys() == keys and follower.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until rank 1 has reached the store (or failed there): then rank 0 starts
    second = _results([_rank(0, 1, port), follower])
    assert [(code, out) for code, out, _ in second] == [(0, "3\n"), (0, "3\n")], second[1][2][-3000:]


@pytest.mark.slow
def test_ranks_of_different_torchrun_attempts_are_told_why_they_do_not_meet():
    """A host whose torchrun started again alone (a reboot, a restarted pod) counts its attempts from
    0 while the other hosts' agents count on: its ranks and theirs meet under different names, never.
    The refusal asked only whether they shared MASTER_ADDR and MASTER_PORT, which they did."""
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(60))
    results = _results([_rank(0, 1, port, timeout=3), _rank(1, 0, port, timeout=3)])
    assert [code for code, _, _ in results] == [1, 1], results
    for rank, (_, _, err) in enumerate(results):
        assert f"rank {rank} of 2: the group did not meet at 127.0.0.1:{port} within 3 s" in err, err[-3000:]
        assert f"TORCHELASTIC_RESTART_COUNT={1 - rank} here" in err, err[-3000:]
    del agent
