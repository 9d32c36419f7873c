"""The liveness stamps on one clock, Redis's: a worker whose host's clock is off its readers' (the
gateway's, ``dayzero up``'s, a healthcheck's) is live while it stamps and frozen once it stops.
The skew is played by the worker's process alone (its ``time.time`` moved); the readers are the
real ones (``/ready``: test_readiness.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from dayzero.cli import main
from dayzero.procs import spawn
from dayzero.serving.keys import key
from dayzero.serving.liveness import process_id
from dayzero.stack import Child, Stack

from .conftest import wait_until

# put before a worker's script: its process's clock ``skew`` seconds off this host's (another host's)
SKEWED_CLOCK = "import time; _host_time = time.time; time.time = lambda: _host_time() + {skew}\n"

# a real worker: ``dayzero serve`` argv[1] (the stage) ``--name`` argv[2]
SERVE = """
import sys
from dayzero.cli import main
sys.exit(main(["serve", sys.argv[1], "--name", sys.argv[2]]))
"""


def skewed_worker(stage: str, name: str, skew: float, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A real worker of ``stage`` (its settings in ``env``) whose process's clock is ``skew`` s off this host's."""
    return spawn(
        [sys.executable, "-c", SKEWED_CLOCK.format(skew=skew) + SERVE, stage, name], log, {**os.environ, **env}
    )


def announced(client: redis.Redis, stage: str, worker: str) -> str | None:
    """The process of ``worker`` (its ``--name``) whose heartbeat and snapshot are in the registry (None: none yet)."""
    for process in client.hkeys(key("workers", stage)):
        if process.startswith(f"{worker}@".encode()) and client.exists(key("usage", process.decode())):
            return process.decode()
    return None


# a prefill worker's liveness stamps in a process of its own, ready
PULSE = """
import sys, time
from dayzero.serving.liveness import Pulse, connect
Pulse(connect(sys.argv[1]), "prefill").start().ready()
time.sleep(300)
"""


def test_a_worker_whose_clock_is_behind_is_healthy_while_it_stamps_and_frozen_once_it_stops(
    redis_url, tmp_path, monkeypatch, capsys
):
    """The stamps were the worker's own time, read against the reader's: a worker 10 s behind was
    unhealthy for ``dayzero alive`` while it stamped (its stamps 10 s old), and never frozen for
    ``dayzero up`` (a stamp older than its spawn is taken for a pid used again): SIGSTOPped, it was
    never restarted. Now both read Redis's clock."""
    client = redis.Redis.from_url(redis_url)
    client.delete(key("alive", "prefill"), key("ready", "prefill"))
    monkeypatch.setenv("DAYZERO_REDIS_URL", redis_url)
    started = time.monotonic()
    worker = subprocess.Popen([sys.executable, "-c", SKEWED_CLOCK.format(skew=-10) + PULSE, redis_url])
    child = Child("prefill0", "prefill", proc=worker, started=started)
    stack = Stack({}, 0, tmp_path, redis_url=redis_url, children=[child], frozen_s=2.0)
    try:
        process = process_id(worker.pid, socket.gethostname())
        assert wait_until(lambda: client.hexists(key("ready", "prefill"), process), 60)
        assert main(["alive", "prefill", "--within", "5"]) == 0, capsys.readouterr().out
        assert stack.frozen() == []
        worker.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: stack.frozen() == [child], 5 * stack.frozen_s, step_s=0.2)
        assert wait_until(lambda: main(["alive", "prefill", "--within", "5"]) == 1, 10)
    finally:
        worker.kill()
        worker.wait()
