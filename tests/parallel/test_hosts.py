"""Ranks on separate hosts: ``dayzero generate --tensor-parallel 2`` under torchrun on two "hosts"
(network namespaces joined by a veth pair, gloo over TCP on the veth), and two ranks started by
hand with torchrun's variables, one of which is killed mid-generation.

Every process is a real rank; every test stops every process it started (and the namespaces).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dayzero import cli
from dayzero.procs import free_port

from .test_tensor_parallel import TP4

ADDRESSES = ("10.231.7.1", "10.231.7.2")  # a private /30: the two ends of the veth
MASTER_PORT = 29500  # free in a namespace of its own
PROMPT = ["--prompt-ids", "3,14,15,92,65,35"]
RUN_S = 120  # a pair of ranks that has not exited by then has hung: fail, stop them


class Hosts:
    """Two network namespaces ``{tag}a`` and ``{tag}b``, a veth pair between them; ``root``: host 0
    is this machine's own namespace (where the stack's Redis answers on 127.0.0.1)."""

    def __init__(self, tag: str, root: bool = False) -> None:
        self.names = (None if root else f"{tag}a", f"{tag}b")
        self.links = (f"{tag}va", f"{tag}vb")  # interface names: 15 characters at most

    def add(self) -> None:
        for name in filter(None, self.names):
            _ip("netns", "add", name)

    def connect(self) -> None:
        (a, b), (va, vb) = self.names, self.links
        _ip("link", "add", va, *(["netns", a] if a else []), "type", "veth", "peer", "name", vb, "netns", b)
        for name, link, address in zip(self.names, self.links, ADDRESSES, strict=True):
            where = ["-n", name] if name else []
            _ip(*where, "addr", "add", f"{address}/30", "dev", link)
            _ip(*where, "link", "set", link, "up")
            if name:
                _ip(*where, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Remove the namespaces (and with them the veth pair); the ones never made are skipped."""
        for name in filter(None, self.names):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def start(self, host: int, argv: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
        command = ["ip", "netns", "exec", self.names[host], *argv] if self.names[host] else argv
        io = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
        return subprocess.Popen(command, env=env, **io)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _hosts(root: bool):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed")
    made = Hosts(f"dz{os.getpid() % 100000}{'r' if root else ''}", root)
    try:
        made.add()
    except subprocess.CalledProcessError as exc:
        made.delete()
        pytest.skip(f"`{' '.join(exc.cmd)}` is not permitted here: {exc.stderr.strip()}")
    try:
        made.connect()
        yield made
    finally:
        made.delete()


@pytest.fixture
def hosts():
    yield from _hosts(root=False)


@pytest.fixture
def root_and_host():
    """Host 0 is this namespace, host 1 a namespace of its own, a veth between them."""
    yield from _hosts(root=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Kill what still runs of each process and its descendants (torchrun's workers have sessions
    of their own, so a process group would miss them); reap them."""
    for proc in procs:
        try:
            family = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
        except psutil.NoSuchProcess:
            family = []
        for member in family:
            try:
                member.kill()
            except psutil.NoSuchProcess:
                continue
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each process's exit status, stdout and stderr; all stopped after ``RUN_S`` regardless."""
    deadline, results = time.monotonic() + RUN_S, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out, err))
    finally:
        _stop(procs)
    return results


def meeting(node: int, port: int, rdzv: str = "static") -> list[str]:
    """torchrun's options for where ``node`` of 2 meets the other: static rendezvous
    (--master-addr/--master-port, --node-rank) or c10d (--rdzv-endpoint; node 0 hosts the store:
    is_host, since a veth address is not its hostname's; c10d's rank 0 is the host whose --local-addr
    sorts first: ADDRESSES[0], rank 0 here, with Redis)."""
    if rdzv == "static":
        return ["--master-addr", ADDRESSES[0], "--master-port", str(port), "--node-rank", str(node)]
    meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRESSES[0]}:{port}", "--rdzv-id", "dayzero"]
    return [*meet, "--local-addr", ADDRESSES[node], *(["--rdzv-conf", "is_host=1"] if node == 0 else [])]


def _torchrun(node: int, master_port: int, where: Path, rdzv: str = "static") -> list[str]:
    """torchrun for one of two nodes, its logs in ``where`` (by default torch's agent made a
    ``torchelastic_*`` folder in the temporary directory per start and left it there)."""
    meet = [*meeting(node, master_port, rdzv), "--log-dir", str(where)]
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *meet]


def _scratch(tmp_path: Path) -> Path:
    """A temporary directory (TMPDIR) for the processes a test starts: left empty, checked."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return scratch


def _generate(path: Path, tokens: int = 8) -> list[str]:
    return ["generate", "--checkpoint", str(path), *PROMPT, "--max-tokens", str(tokens), "--tensor-parallel", "2"]


@pytest.mark.slow
def test_two_hosts_under_torchrun_print_one_ranks_tokens(hosts, checkpoint_factory, capsys, tmp_path):
    path = checkpoint_factory("tp4", **TP4)
    assert cli.main(["generate", "--checkpoint", str(path), *PROMPT, "--max-tokens", "8"]) == 0
    single = capsys.readouterr().out
    procs, scratch = [], _scratch(tmp_path)
    for node, link in enumerate(hosts.links):
        # gloo's sockets on the veth, not the hostname's address
        env = {**os.environ, "GLOO_SOCKET_IFNAME": link, "TMPDIR": str(scratch)}
        argv = _torchrun(node, MASTER_PORT, tmp_path / f"torchrun{node}")
        procs.append(hosts.start(node, [*argv, "-m", "dayzero.cli", *_generate(path)], env))
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs)
    assert rc0 == 0 and rc1 == 0, err0[-2000:] + err1[-2000:]
    assert out0 == single and len(single.split(",")) == 8
    assert out1 == ""  # rank 0 prints; rank 1 only computes
    assert list(scratch.iterdir()) == []


def _by_hand(rank: int, port: int, path: Path, tokens: int) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    argv = [sys.executable, "-m", "dayzero.cli", *_generate(path, tokens), "--group-timeout", "30"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_killed_rank_brings_the_other_down_within_seconds(checkpoint_factory):
    path, port = checkpoint_factory("tp4", **TP4), free_port()
    procs = [_by_hand(rank, port, path, tokens=4000) for rank in (0, 1)]
    try:
        assert procs[0].stdout.read(1).isdigit()  # rank 0 has printed its first token: both are decoding
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rc = procs[0].wait(timeout=RUN_S)
        took = time.monotonic() - killed
    finally:
        (_, out, err), _ = _finish(procs)
    assert rc != 0 and len(out.split(",")) < 3999, err[-2000:]  # it stopped, it did not finish
    assert took < 10, f"rank 0 took {took:.1f} s to fail after rank 1 died"  # closed sockets, not the 30 s timeout


@pytest.mark.slow
@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_a_decode_group_across_two_hosts_serves_one_ranks_completions(root_and_host, tmp_path, rdzv):
    """The stack (Redis, gateway, one prefill) here; ``serve decode --tensor-parallel 2`` under
    torchrun (static or c10d rendezvous) with rank 0 here (it talks to Redis) and rank 1 on the
    other host (it talks only to rank 0, over the veth). Completions equal the one-rank engine's."""
    from dayzero.demo import write_demo_checkpoint
    from dayzero.stack import Stack

    from ..services.conftest import SETTINGS_ENV, prompt_ids, stream_text
    from ..services.in_process import engine_completer

    checkpoint = write_demo_checkpoint(tmp_path / "float")  # FP8 blocks do not split at the demo's size
    reference = engine_completer(checkpoint, "cpu")
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(checkpoint)}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path / "logs", env)
    stack.start()
    master_port, scratch = free_port(), _scratch(tmp_path)
    serve = ["-m", "dayzero.cli", "serve", "decode", "--tensor-parallel", "2", "--name", "decode0"]
    ranks = []
    try:
        for node, link in enumerate(root_and_host.links):
            rank_env = {**stack.env, "GLOO_SOCKET_IFNAME": link, "TMPDIR": str(scratch)}
            log = (tmp_path / "logs" / f"decode-node{node}.log").open("w")
            argv = [*_torchrun(node, master_port, tmp_path / f"torchrun{node}", rdzv), *serve]
            ranks.append(root_and_host.start(node, argv, rank_env, stdout=log, stderr=subprocess.STDOUT))
        stack.wait_ready(timeout_s=180)

        def one(i: int) -> tuple[str, str]:
            body = {"model": "dayzero-demo", "prompt": prompt_ids(i), "max_tokens": 8 + i, "temperature": 0}
            text, _, _, _ = stream_text(f"{stack.url}/v1/completions", {**body, "ignore_eos": True})
            return text, reference(prompt_ids(i), 8 + i)

        for i in range(3):
            served, want = one(i)
            assert served == want
    finally:
        stack.stop()
        stopped = _sigterm_rank_zero(ranks)
    assert stopped, "the decode group did not end within 60 s of SIGTERM"
    assert list(scratch.iterdir()) == []


def _sigterm_rank_zero(ranks: list[subprocess.Popen]) -> bool:
    """SIGTERM to host 0's torchrun (it passes it to rank 0, whose stop message ends rank 1);
    whether both ended within 60 s. Whatever still runs is killed."""
    try:
        if ranks:
            ranks[0].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        for proc in ranks:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False
    finally:
        _stop(ranks)
