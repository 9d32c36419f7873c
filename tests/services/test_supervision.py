"""``dayzero up`` as an operator meets it: a killed supervisor, a Redis crash under a stream, SIGINT
to a background job (a port in use: test_up_ports.py). Real processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import httpx
import psutil
import pytest
import torch

import dayzero.stack
from dayzero.procs import consecutive_ports, free_port, spawn
from dayzero.stack import Child, Stack

from .conftest import MODEL, wait_until
from .launch import up_process, wait_ready

LONG = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 2000, "ignore_eos": True, "stream": True}


def _data(response: httpx.Response, after=None) -> list:
    """The ``data:`` payloads of a stream; ``after(n)`` runs once n payloads have come."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
            if after is not None:
                after(len(out))
    return out


def _gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after ``timeout_s`` (orphans are reaped: we are subreaper)."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


class RunningUp:
    """A ``dayzero up`` (gateway, 1 prefill, 1 decode, each worker's /metrics on a port of its own)
    for the tests that need one running, each until it ends it (~30 s a start): started again for
    the next one when the last one ended it. ``err``: its stderr's lines so far."""

    def __init__(self, checkpoint, tmp_path_factory) -> None:
        self.checkpoint, self.tmp = checkpoint, tmp_path_factory
        self.proc: subprocess.Popen | None = None
        self.metrics, self.err = 0, []

    def get(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            port, self.metrics, self.err = free_port(), consecutive_ports(2), []
            extra = {"DAYZERO_METRICS_PORT": str(self.metrics)}
            self.proc = up_process(self.checkpoint, self.tmp.mktemp("up"), port, extra=extra)
            # (read on a thread: a pipe nobody reads fills, and the lines are wanted before the end)
            self.reader = threading.Thread(target=self.err.extend, args=(self.proc.stderr,), daemon=True)
            self.reader.start()
            wait_ready(f"http://127.0.0.1:{port}", self.proc)
        return self.proc

    def pids(self) -> set[int]:
        """(its children are the fixture's, not a test's: see tests/conftest.py)"""
        return {self.proc.pid} if self.proc is not None and self.proc.poll() is None else set()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
            self.reader.join(10)  # (to the pipe's end)
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def running_up(text_dir, tmp_path_factory):
    up = RunningUp(text_dir, tmp_path_factory)
    yield up
    up.close()


def test_each_worker_serves_metrics_on_its_own_port(running_up):
    """DAYZERO_METRICS_PORT=P under up: the workers serve their own /metrics on P, P + 1 in the
    order listed at start (one port for all: every worker but the first died binding it, and up
    gave up after their restarts)."""
    up, metrics = running_up.get(), running_up.metrics
    stages = []
    for at in (metrics, metrics + 1):
        scrape = httpx.get(f"http://127.0.0.1:{at}/metrics", timeout=10).text
        stages.append({s for s in ("prefill", "decode") if f'stage="{s}"' in scrape})
    listed = f"worker metrics (DAYZERO_METRICS_PORT, one port each): prefill0 :{metrics}, decode0 :{metrics + 1}"
    assert stages == [{"prefill"}, {"decode"}]
    assert wait_until(lambda: listed in "".join(running_up.err), 10)
    assert up.poll() is None and "restarted" not in "".join(running_up.err)  # (its clean stop: the SIGINT test)


def test_a_killed_supervisor_takes_every_child_with_it(running_up):
    up = running_up.get()
    children = psutil.Process(up.pid).children(recursive=True)
    assert {p.name() for p in children} >= {"redis-server"} and len(children) >= 4  # + gateway, prefill, decode
    up.kill()
    up.wait()
    assert _gone(children, 5) == []


def test_redis_crash_mid_stream_then_sigint_to_a_background_supervisor(text_dir, tmp_path):
    """A stream that loses Redis ends with an error event and [DONE]; the supervisor restarts
    Redis and the stack serves again; SIGINT (ignored by inheritance, as in a background job)
    still stops it in order: the open stream ends with a shutdown error, nothing is killed."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    up = up_process(text_dir, tmp_path, port, preexec_fn=ignore_sigint)
    wait_ready(url, up)
    redis_server = next(p for p in psutil.Process(up.pid).children() if p.name() == "redis-server")
    kill_redis = lambda n: n == 3 and redis_server.kill()  # noqa: E731
    with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=60) as r:
        lost = _data(r, kill_redis)
    assert lost[-1] == "[DONE]" and lost[-2]["error"]["code"] == "queue_unavailable"
    assert set(lost[-2]["error"]) == {"message", "type", "param", "code"}
    wait_ready(url, up, 120)  # a new Redis on the same port; the gateway and workers reconnect
    after = {**LONG, "stream": False, "max_tokens": 4}
    served = httpx.post(f"{url}/v1/completions", json=after, timeout=120)
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4
    children = psutil.Process(up.pid).children(recursive=True)
    with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=60) as r:
        ended = _data(r, lambda n: n == 3 and up.send_signal(signal.SIGINT))
    assert ended[-1] == "[DONE]" and ended[-2]["error"]["code"] == "shutting_down"
    _, err = up.communicate(timeout=60)
    assert up.returncode == 0, err[-2000:]
    assert "redis exited (SIGKILL); restarted" in err and "stopping: gateway, then workers, then redis" in err
    assert "killed" not in err  # every child honoured SIGTERM
    assert _gone(children, 5) == []


def test_a_stack_stopping_with_its_redis_unlinks_the_embeddings_its_vision_workers_parked(demo_dir, tmp_path):
    """Requests queued for prefill went with the Redis, so nobody could read their image embeddings:
    they stayed in /dev/shm until a vision worker swept them past their deadline (an hour later, at
    the next start)."""
    from dayzero.serving.parked import publish_tensor
    from dayzero.shm import SHM_DIR, parked_name
    from dayzero.stack import Stack

    mine = publish_tensor(torch.zeros(4), "k", "shm", None, 60)  # (the store only serves Redis parking)
    assert f"-{os.getpid()}-" in mine.location  # a parked segment names the process that made it
    env = {"DAYZERO_CHECKPOINT": str(demo_dir)}
    stack = Stack({"vision": 1, "prefill": 0, "decode": 0}, free_port(), tmp_path, env)
    stack.start()
    (vision,) = stack.vision_pids
    theirs = SHM_DIR / parked_name(60).replace(f"-{os.getpid()}-", f"-{vision}-")
    theirs.write_bytes(b"x")
    try:
        stack.stop()
        assert not theirs.exists() and (SHM_DIR / mine.location).exists()  # another process's are kept
    finally:
        (SHM_DIR / mine.location).unlink(missing_ok=True)
        theirs.unlink(missing_ok=True)


def test_a_stack_stopping_continues_its_stopped_children_which_stop_cleanly(demo_dir, tmp_path):
    """A SIGSTOPped child acts on SIGTERM only once continued: stop killed it after its timeout,
    and a worker killed so left its KV pool segment in /dev/shm (256 MB by default) until the
    next worker started on the host."""
    from dayzero.shm import SHM_DIR
    from dayzero.stack import Stack

    env = {"DAYZERO_CHECKPOINT": str(demo_dir), "DAYZERO_KV_BUDGET_MB": "32"}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path, env)
    stack.start()
    try:
        worker = stack.child("prefill0").proc
        started = lambda: "prefill0@" in (log := (tmp_path / "prefill0.log").read_text()) and " ready." in log  # noqa: E731
        assert wait_until(started, 120), "not started"  # (stopped while loading, it has no SIGTERM handler yet)
        assert list(SHM_DIR.glob(f"dz-kv-{worker.pid}-*")), "no pool segment"
        worker.send_signal(signal.SIGSTOP)
    finally:
        killed = stack.stop()
    assert list(SHM_DIR.glob(f"dz-kv-{worker.pid}-*")) == [] and killed == []


def test_a_worker_sigtermed_while_it_starts_ends_at_once_and_unlinks_its_pool_segment(demo_dir, tmp_path):
    """Before Celery installs its SIGTERM handler (loading the weights, warming up) SIGTERM ended a
    worker by Python's default action: its KV pool segment (256 MB by default) stayed in /dev/shm
    until the next worker start on the host swept it. Held (SIGSTOP) the moment its segment
    appears, seconds before it is ready, then SIGTERMed."""
    from dayzero.shm import SHM_DIR

    env = {"DAYZERO_CHECKPOINT": str(demo_dir), "DAYZERO_KV_BUDGET_MB": "32"}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path, env)
    stack.start()
    worker = stack.child("prefill0").proc
    segments = lambda: list(SHM_DIR.glob(f"dz-kv-{worker.pid}-*"))  # noqa: E731
    try:
        assert wait_until(segments, 120, step_s=0.01), "no pool segment"
        worker.send_signal(signal.SIGSTOP)
        worker.send_signal(signal.SIGTERM)
        worker.send_signal(signal.SIGCONT)
        exit_code = worker.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # as in a container whose init ended: the rest are killed,
            os.killpg(worker.pid, signal.SIGKILL)  # multiprocessing's resource tracker too (it could unlink it)
        assert segments() == []
        assert exit_code == 128 + signal.SIGTERM  # its own exit, not the signal's (-15)
    finally:
        stack.stop()
        for segment in segments():
            segment.unlink()


def test_restarting_a_child_that_exited_kills_what_is_left_of_its_process_group(tmp_path, monkeypatch):
    """A tensor-parallel rank stopped (or hung) before it could die with its rank 0 (die_with)
    outlived it for good, in the dead rank 0's process group: a stopped rank is left here by a
    child that then exits."""
    monkeypatch.setattr(dayzero.stack, "LEFT_GROUP_S", 0.5)  # (5 s: the grace this test waits out)
    stack = Stack({"prefill": 0, "decode": 0}, free_port(), tmp_path, redis_port=free_port())
    rank_pid = tmp_path / "rank.pid"
    script = f"sleep 60 & echo $! > {rank_pid}; kill -STOP $!; exit 3"
    stack.children = [Child("redis", "redis", proc=spawn(["sh", "-c", script], tmp_path / "rank0.log"))]
    stack.children[0].proc.wait()
    rank = psutil.Process(int(rank_pid.read_text()))
    try:
        assert stack.supervise() == ["redis"]  # restarted (here a Redis: a light child to start)
        assert stack.child("redis").why == "exited (code 3)"  # (was "exited": a crash, a kill, alike)
        gone = lambda: not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE  # noqa: E731
        assert wait_until(lambda: stack.supervise() == [] and gone(), 10)  # (SIGKILLed after LEFT_GROUP_S)
    finally:
        stack.stop()
        if rank.is_running():
            rank.kill()


def test_up_with_a_broken_checkpoint_stops_with_the_workers_error(text_dir, tmp_path):
    """Weights whose headers are sound (up's preflight passes them) but whose FP8 data decodes to NaN."""
    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(text_dir, tmp_path / "broken")
    tensors = load_file(broken / "model.safetensors")
    name = next(k for k, t in tensors.items() if t.dtype == torch.float8_e4m3fn)
    tensors[name] = torch.full_like(tensors[name].view(torch.uint8), 0x7F).view(torch.float8_e4m3fn)  # E4M3's NaN
    save_file(tensors, broken / "model.safetensors")
    up = [sys.executable, "-m", "dayzero.cli", "up", "--checkpoint", str(broken)]  # (no vision tower: no vision worker)
    up += ["--port", str(free_port()), "--log-dir", str(tmp_path / "logs")]
    env = {**os.environ, "DAYZERO_LEASE_S": "1.0", "DAYZERO_START_EXITS": "2"}  # (3 by default: one more start)
    done = subprocess.run(up, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "FP8 weight decodes to non-finite values" in done.stderr
    name = re.search(r"error: (\S+) keeps exiting while starting", done.stderr)[1]
    restarts = re.findall(rf"^{name} exited \(code [1-9]\d*\); restarted$", done.stderr, re.MULTILINE)
    assert len(restarts) == 1, done.stderr[-2000:]  # restarted once, then given up on its second exit
