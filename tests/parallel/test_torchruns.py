"""Two hosts' torchruns (static rendezvous unless c10d is named, both on this machine's loopback),
each running one rank that all-reduces until its group fails: what each host sees when rank 0 dies
alone, and when the torchrun on rank 0's host is started again alone (a rebooted host, a restarted
pod); how host 1's torchrun ends when host 0's is stopped; and which host c10d makes rank 0.

Every process is real (torchrun's agents, gloo ranks); every test stops every process it started.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dayzero.procs import free_port

from .test_hosts import _stop

RANK = """
import os, sys, time, torch
from dayzero.parallel.collectives import GroupFailed
from dayzero.parallel.group import run_group
from dayzero.parallel.launch import launch_from
def reduce_until_failed(group):
    print("formed", flush=True)
    while True:
        group.all_reduce_sum(torch.ones(1))
        time.sleep(0.2)
try:
    run_group(2, reduce_until_failed, launch=launch_from(os.environ, "cpu"), timeout=30.0)
except GroupFailed as exc:
    print(f"group failed: {exc}", flush=True)
    sys.exit(4)
"""
STOPPED_BY_RANK_0 = """
import signal, sys, time, torch, torch.distributed as dist
stop = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda *_: stop.fill_(1.0))
dist.init_process_group("gloo")
print("formed", flush=True)
while True:  # rank 0's SIGTERM ends every rank at the next sum, as dayzero's stop message does
    flags = stop.clone()
    dist.all_reduce(flags)
    if flags.item():
        dist.destroy_process_group()
        sys.exit(0)
    time.sleep(0.1)
"""
NUMBERED = """
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
ROOT = Path(__file__).resolve().parents[2]
RUN_S = 120  # a torchrun that has not done what it was waited for by then will not
GONE = "the rendezvous store at 127.0.0.1:{port} does not answer either"


class Torchruns:
    """Host ``node``'s torchrun, started (again) on demand; each host's output appended to its log.
    ``rdzv``: static (--master-addr/--master-port, --node-rank) or c10d (host 0 serves its store:
    is_host, as both hosts' addresses are this machine's; ``local_addrs``: each host's --local-addr)."""

    def __init__(
        self, tmp_path: Path, rdzv: str = "static", rank: str = RANK, env: dict | None = None, local_addrs=()
    ) -> None:
        self.port, self.tmp, self.rdzv, self.env = free_port(), tmp_path, rdzv, env or {}
        self.local_addrs = local_addrs
        (tmp_path / "rank.py").write_text(rank)
        self.agents: list[subprocess.Popen | None] = [None, None]

    def start(self, node: int, python: tuple[str, ...] = ()) -> None:
        """``python``: the interpreter's own options for that torchrun (``-X importtime``)."""
        if self.rdzv == "static":
            meet = ["--master-addr", "127.0.0.1", "--master-port", str(self.port), "--node-rank", str(node)]
        else:
            meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", "dz"]
            meet += ["--rdzv-conf", f"is_host={int(node == 0)}"]
            meet += ["--local-addr", self.local_addrs[node]] if self.local_addrs else []
        argv = [sys.executable, *python, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *meet]
        argv += ["--max-restarts", "3", "--log-dir", str(self.tmp / f"torchrun{node}"), str(self.tmp / "rank.py")]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log(node).open("a") as log:
            self.agents[node] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self, node: int) -> Path:
        return self.tmp / f"host{node}.log"

    def text(self, node: int) -> str:
        return self.log(node).read_text() if self.log(node).exists() else ""

    def until(self, done, what: str) -> None:
        deadline = time.monotonic() + RUN_S
        while not done():
            logs = "\n".join(self.text(node)[-3000:] for node in (0, 1))
            assert time.monotonic() < deadline, f"{what}: not within {RUN_S} s\n{logs}"
            time.sleep(0.2)

    def formed(self, times: int) -> None:
        """Until both hosts' ranks have formed the group ``times`` times in all."""
        self.until(lambda: all(self.text(n).count("formed\n") >= times for n in (0, 1)), f"formed {times} times")

    def rank(self, node: int) -> psutil.Process:
        script = str(self.tmp / "rank.py")
        [rank] = [child for child in psutil.Process(self.agents[node].pid).children() if script in child.cmdline()]
        return rank

    def stop(self) -> None:
        _stop([agent for agent in self.agents if agent is not None])


@pytest.fixture
def torchruns(tmp_path):
    made = Torchruns(tmp_path)
    try:
        yield made
    finally:
        made.stop()


@pytest.mark.slow
def test_a_torchrun_started_again_alone_on_rank_0s_host_is_named_and_met_once_the_others_start_again(torchruns):
    """Rank 0 killed alone: both agents restart their ranks and the group forms again; rank 1's
    failure does not blame the store. Then host 0's torchrun killed with its rank and started
    again: host 1's agent, connected to the gone store, failed at its restart (torchrun exit 1,
    "DistNetworkError: Broken pipe") and host 0's new torchrun waited for it (600 s, static
    rendezvous): nothing said why. Rank 1 now says the store is gone and every host's torchrun must
    start again; once host 1's does (its supervisor), the group forms."""
    for node in (0, 1):
        torchruns.start(node)
    torchruns.formed(1)
    torchruns.rank(0).kill()
    torchruns.formed(2)  # each agent's one restart
    [failed] = [line for line in torchruns.text(1).splitlines() if line.startswith("group failed")]
    assert GONE.format(port=torchruns.port) not in failed, failed
    # host 0's torchrun and its rank: gone, the store's server first (killed after the rank, as _stop
    # does, rank 1's check of the store came in before the server's end on a loaded host: it answered)
    agent = torchruns.agents[0]
    ranks = psutil.Process(agent.pid).children(recursive=True)
    agent.kill()
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.kill()
    _stop([agent])  # (reaped)
    torchruns.start(0)
    torchruns.until(lambda: torchruns.agents[1].poll() is not None, "host 1's torchrun exited")
    assert torchruns.agents[1].returncode == 1
    since = torchruns.text(1).split("formed\n")[-1]  # host 1's lines since its rank's group last formed
    assert GONE.format(port=torchruns.port) in since and "start every host's torchrun again" in since, since[-3000:]
    torchruns.start(1)  # as host 1's supervisor would
    torchruns.formed(3)


def image_env() -> dict[str, str]:
    """The variables docker/base.Dockerfile's ``ENV`` lines set (every dayzero image's)."""
    lines = (ROOT / "docker" / "base.Dockerfile").read_text().splitlines()
    words = [word for line in lines if line.startswith("ENV ") for word in shlex.split(line[len("ENV ") :])]
    return dict(word.split("=", 1) for word in words)


@pytest.mark.slow
def test_host_1s_torchrun_ends_without_importing_dynamo_when_host_0s_is_stopped(tmp_path):
    """SIGTERM to host 0's torchrun (its supervisor stopping it): rank 0 ends the group, host 1's rank
    exits 0, and host 1's agent finds host 0's store gone at torchrun's exit barrier. Printing that
    traceback made torch's own log format import torch._dynamo (3.5-8 s, more under load) before
    host 1's torchrun could exit. The image's TORCH_LOGS_FORMAT, a plain format, imports nothing."""
    torchruns = Torchruns(tmp_path, rank=STOPPED_BY_RANK_0, env=image_env())
    try:
        torchruns.start(0)
        torchruns.start(1, python=("-X", "importtime"))  # each import's line on stderr, in host 1's log
        torchruns.formed(1)
        torchruns.agents[0].send_signal(signal.SIGTERM)
        torchruns.until(lambda: torchruns.agents[1].poll() is not None, "host 1's torchrun exited")
    finally:
        torchruns.stop()
    host1 = torchruns.text(1)
    assert torchruns.agents[1].returncode == 0, host1[-3000:]
    assert "Error waiting on exit barrier" in host1, host1[-3000:]  # the path this is about
    dynamo = [line for line in host1.splitlines() if line.startswith("import time:") and "torch._dynamo" in line]
    assert dynamo == [], f"host 1's torchrun imported torch._dynamo: {dynamo[-1]}"


@pytest.mark.slow
def test_c10d_makes_rank_0_the_host_whose_local_address_sorts_first_not_the_store_s(tmp_path):
    """docs/parallel.md said to give ``is_host=1`` to rank 0's host under c10d rendezvous: is_host
    only serves the store; torch numbers the hosts by their --local-addr (else hostname) sorted as
    text. Host 0 serves the store, is the endpoint's and starts first, its address sorting second:
    its rank is 1 (rank 0, the one that talks to Redis, is on the other host)."""
    torchruns = Torchruns(tmp_path, "c10d", rank=NUMBERED, local_addrs=("127.0.0.2", "127.0.0.1"))
    try:
        torchruns.start(0)
        time.sleep(2)  # host 0's store first
        torchruns.start(1)
        torchruns.until(lambda: all(agent.poll() is not None for agent in torchruns.agents), "both torchruns exited")
    finally:
        torchruns.stop()
    ranks = [[line for line in torchruns.text(node).splitlines() if line.startswith("rank ")] for node in (0, 1)]
    assert ranks == [["rank 1"], ["rank 0"]], torchruns.text(0)[-2000:] + torchruns.text(1)[-2000:]
