"""A worker group's orderly stop ends every rank with exit code 0, also when the stack's Redis went
first: rank 1's torchrun on another host reads any other code as a failure and starts it again
(``--max-restarts``), or exits 1.

Real processes: the stack (Redis, gateway, one prefill), ``serve decode --tensor-parallel 2`` as two
ranks started by hand with torchrun's variables on this host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dayzero.procs import free_port

from .test_hosts import _stop

STOP_S = 60  # a rank that has not exited this long after rank 0's SIGTERM has hung


def _rank(rank: int, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    env = {**env, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env |= {"MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "dayzero.cli", "serve", "decode", "--tensor-parallel", "2", "--name", "decode0"]
    with log.open("w") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_a_group_stopped_after_its_redis_ends_every_rank_with_code_0(tmp_path):
    """Redis gone, rank 0's stop waits out the shutdown grace and its watchdog ended the process
    at once: the loop thread, which tells the other ranks to stop as it ends, had not sent it yet,
    and rank 1 logged "the tensor-parallel group failed" and exited 4."""
    from dayzero.demo import write_demo_checkpoint
    from dayzero.stack import Stack

    from ..services.conftest import SETTINGS_ENV

    checkpoint = write_demo_checkpoint(tmp_path / "float")
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(checkpoint)}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path / "logs", env)
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]
    ranks: list[subprocess.Popen] = []
    try:
        stack.start()
        port = free_port()
        ranks = [_rank(rank, port, {**os.environ, **stack.env}, logs[rank]) for rank in (0, 1)]
        stack.wait_ready(timeout_s=180)
        stack.stop()  # its Redis with it: rank 0's stop cannot reach it
        ranks[0].send_signal(signal.SIGTERM)
        codes = [rank.wait(timeout=STOP_S) for rank in ranks]
    finally:
        stack.stop()
        _stop(ranks)
    told = [log.read_text() for log in logs]
    assert codes == [0, 0], told[1][-3000:]
    assert "group failed" not in told[1], told[1][-3000:]
