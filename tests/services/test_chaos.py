"""Chaos under traffic, real processes: SIGKILL the gateway, a vision, prefill and decode worker,
Redis and at last the supervisor of a ``dayzero up``. Every request completes or fails with a
clear error (an OpenAI-style error body or stream error event, then [DONE]; a dropped
connection only while the gateway itself is down), and nothing is left running afterwards."""

from __future__ import annotations

import collections
import json
import threading
import time
from functools import partial

import httpx
import psutil
import pytest

from dayzero.procs import free_port
from dayzero.shm import unlink_parked_by

from .conftest import MODEL, data_url, wait_until
from .launch import up_process, wait_ready

ERROR_KEYS = {"message", "type", "param", "code"}


def _bodies() -> list[tuple[str, dict]]:
    image = {"type": "image_url", "image_url": {"url": data_url(40, 40, 3)}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]
    return [
        ("/v1/completions", {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 40, "ignore_eos": True}),
        ("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 12, "ignore_eos": True}),
        ("/v1/completions", {"model": MODEL, "prompt": [0, 9, 8], "max_tokens": 24, "ignore_eos": True}),
    ]


def _outcome(url: str, path: str, body: dict, stream: bool) -> str:
    """'done', 'error' (clear, in OpenAI's shape), 'dropped' (transport) or what went wrong."""
    try:
        with httpx.stream("POST", url + path, json={**body, "stream": stream}, timeout=120) as r:
            if r.status_code != 200:
                error = json.loads(r.read())["error"]
                return "error" if set(error) == ERROR_KEYS else f"bad error body {error}"
            if not stream:
                return "done" if json.loads(r.read())["choices"][0]["finish_reason"] in ("stop", "length") else "odd"
            data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    except httpx.TransportError:
        return "dropped"
    if data[-1:] != ["[DONE]"] or len(data) < 2:
        return f"stream ended without [DONE]: {data[-2:]}"
    last = json.loads(data[-2])
    if "error" in last:
        return "error" if set(last["error"]) == ERROR_KEYS else f"bad error event {last}"
    return "done" if last["choices"][0]["finish_reason"] in ("stop", "length") else f"finish {last}"


class Traffic:
    """A few clients sending streamed and non-streamed requests until stopped; outcomes by time."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url, self.stop, self.seen = url, threading.Event(), []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        bodies, n = _bodies(), 0
        while not self.stop.is_set():
            path, body = bodies[(i + n) % len(bodies)]
            start = time.time()
            result = _outcome(self.url, path, body, stream=n % 3 != 2)
            self.seen.append((start, time.time(), result))
            n += 1
            if result != "done":
                time.sleep(0.2)

    def end(self) -> list:
        self.stop.set()
        for t in self.threads:
            t.join(180)
        return self.seen


def _child(up: psutil.Process, log_name: str) -> psutil.Process:
    """The supervisor's child whose command line names it (``--name decode0``, or redis-server)."""
    for proc in up.children():
        cmd = proc.cmdline()
        if (log_name == "redis" and proc.name() == "redis-server") or cmd[-2:] == ["--name", log_name]:
            return proc
    raise LookupError(log_name)


def _restarted(up: psutil.Process, log_name: str, was: int) -> bool:
    """The supervisor runs a process named ``log_name`` again, not pid ``was``."""
    try:
        return _child(up, log_name).pid != was
    except (LookupError, psutil.Error):  # (between its death and its restart)
        return False


@pytest.mark.slow
def test_sigkill_every_part_under_traffic(demo_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up = up_process(demo_dir, tmp_path, port, "--vision 1 --prefill 1 --decode 1")
    wait_ready(url, up)
    supervisor = psutil.Process(up.pid)
    traffic, gateway_down, last_kill = Traffic(url), [], float("inf")
    visions = {_child(supervisor, "vision0").pid}  # the image embeddings they park (in /dev/shm)
    try:
        for victim in ("decode0", "prefill0", "vision0", "redis", "gateway"):
            time.sleep(2)  # traffic in flight (the last kill's re-runs among it, unless they were quick)
            killed_at, victim_pid = time.time(), _child(supervisor, victim).pid
            psutil.Process(victim_pid).kill()
            assert wait_until(partial(_restarted, supervisor, victim, victim_pid), 120)
            wait_ready(url, up, 180)  # ready again: the others reconnected
            visions.add(_child(supervisor, "vision0").pid)
            if victim == "gateway":
                gateway_down.append((killed_at, time.time()))
        time.sleep(3)
        children = supervisor.children(recursive=True)
        last_kill = time.time()
        up.kill()  # at last the supervisor, under traffic
        up.wait()
    finally:
        seen = traffic.end()
        up.kill()
        up.wait()
        up.stderr.close()
    _, alive = psutil.wait_procs(children, timeout=5)
    unlink_parked_by(visions)  # a supervisor SIGKILLed cannot (a stopped one does: test_supervision)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    ((down_from, down_to),) = gateway_down
    unclear = [
        s
        for s in seen
        if s[2] not in ("done", "error")
        and not (s[2] == "dropped" and (s[0] <= down_to and s[1] >= down_from or s[1] >= last_kill))
    ]
    print("outcomes:", collections.Counter(s[2] for s in seen))  # shown with -s, and on failure
    assert unclear == []
    assert sum(s[2] == "done" for s in seen) >= 5  # it kept serving between the kills
