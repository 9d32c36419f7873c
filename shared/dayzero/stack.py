"""``dayzero up``: Redis, the gateway and N workers per stage as plain processes on one machine.

Each service runs the same entry point as its container under docker compose (``dayzero serve <service>``; a
tensor-parallel worker is one child, its rank 0, which starts its other ranks and takes them down with it). A child
that dies is restarted, the embedded Redis included (the gateway and the workers reconnect by themselves), and so is
a frozen worker (SIGSTOPped, or hung in a step past its bound): its liveness stamps (dayzero.serving.liveness)
stopped. A child that exits before it has run a while ready, again and again, waits before its next start, twice as
long each time (stack_child.py); ``until_ready`` supervises until one runs ready again. Every child dies with the
supervisor, whichever thread started it (procs.Spawner). ``stop`` goes in order: the gateway first (it stops
admitting and ends its open streams with an error event), then the workers, Redis last.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .procs import (
    Spawner,
    UnbindableHost,
    exited,
    free_port,
    group_gone,
    kill_group,
    local_url,
    port_in_use,
    spawn,
    start_redis,
    stops_held,
    terminate,
)
from .service_commands import SERVICES, inherited, service_argv
from .serving.liveness import connect
from .settings import REDIS_ANSWER_WITHIN_S
from .shm import unlink_parked_by, unlink_pools_by
from .stack_child import Child
from .stack_stamps import StampRead, StampReader, stale
from .stack_start import StartFailed, answering

STOP_TIMEOUT_S = 10.0  # per group (gateway, workers, redis) before SIGKILL
LEFT_GROUP_S = 5.0  # what is left of an exited child's process group is SIGKILLed after
SUPERVISE_EVERY_S = 0.3  # between up's passes of supervise(): a child ready for longer is seen ready


@dataclass
class Stack:
    counts: dict[str, int]
    port: int
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    host: str = "127.0.0.1"  # where the gateway binds (DAYZERO_HOST)
    ranks: dict[str, int] = field(default_factory=dict)  # tensor-parallel ranks per prefill / decode worker
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)  # a service's workers' own (device_shares)
    children: list[Child] = field(default_factory=list)
    redis_port: int | None = None
    metrics_ports: dict[str, int] = field(default_factory=dict)  # DAYZERO_METRICS_PORT: worker -> its port
    vision_pids: set[int] = field(default_factory=set)  # every vision process started (restarts too)
    start_exits: int = 3  # DAYZERO_START_EXITS: exits of one child before the stack is ready that are a failed start
    redis_answer_within_s: float = REDIS_ANSWER_WITHIN_S  # DAYZERO_REDIS_ANSWER_WITHIN_S: an external one's ping
    frozen_s: float = 0.0  # DAYZERO_FROZEN_WORKER_S: a worker whose liveness stamp is older is restarted (0: never)
    stop_timeout_s: float = STOP_TIMEOUT_S  # per group at ``stop``, before SIGKILL
    _stamps: StampReader | None = None  # (made at the first read)
    _unread_at: float = 0.0  # when Redis last could not be read or written: no stamp counts as older than that
    _left: dict[int, float] = field(default_factory=dict)  # exited children's process groups -> when to kill the rest
    _spawner: Spawner = field(default_factory=Spawner)  # forks every child: whichever thread supervises
    _passes: threading.Lock = field(default_factory=threading.Lock)  # a supervise() pass, or stop()'s start
    _stopping: bool = False  # stop() began: no pass restarts a child

    def start(self) -> None:
        self._stopping = False
        try:
            taken = port_in_use(self.host, self.port)
        except UnbindableHost as exc:
            raise StartFailed(f"DAYZERO_HOST={exc}") from None
        if taken:
            raise StartFailed(f"port {self.port} is already in use on {self.host}; stop that process or pass --port")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.redis_url is not None:
            answering(self.redis_url, self.redis_answer_within_s)
        else:  # (embedded)
            self.redis_port = free_port()
            self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
            self.children = [Child("redis", "redis")]
        own = {"DAYZERO_REDIS_URL": self.redis_url, "DAYZERO_PORT": str(self.port)}
        self.env = {**inherited(os.environ), **self.env, **own}
        self.children.append(Child("gateway", "gateway"))
        for service in ("vision", "prefill", "decode"):
            n, theirs = self.counts.get(service, int(service != "vision")), self.service_env.get(service, {})
            self.children += [Child(f"{service}{i}", service, env=dict(theirs)) for i in range(n)]
        self._metrics_ports()
        for child in self.children:
            self._spawn(child)

    def _metrics_ports(self) -> None:
        """With DAYZERO_METRICS_PORT=P each worker serves its /metrics on a port of its own, P, P + 1,
        ... (one port for all: the first bound it, the others died and crash-looped)."""
        base = self.env.get("DAYZERO_METRICS_PORT")
        if not base:
            return
        workers = [c for c in self.children if c.service in ("vision", "prefill", "decode")]
        if int(base) + len(workers) - 1 > 65535:
            raise StartFailed(f"DAYZERO_METRICS_PORT={base}: {len(workers)} workers need ports up to 65535")
        for i, child in enumerate(workers):
            if port_in_use("0.0.0.0", int(base) + i):  # where prometheus_client binds
                raise StartFailed(
                    f"port {int(base) + i} (DAYZERO_METRICS_PORT + {i}, {child.name}'s /metrics) is already in use; "
                    f"stop that process or choose another DAYZERO_METRICS_PORT"
                )
            child.env["DAYZERO_METRICS_PORT"] = str(int(base) + i)
            self.metrics_ports[child.name] = int(base) + i

    def _spawn(self, child: Child) -> None:
        log, child.started, child.ready_at = self.log_dir / f"{child.name}.log", time.monotonic(), None
        argv = service_argv(child.service, self.ranks.get(child.service, 1))
        cmd = [sys.executable, "-m", "dayzero.cli", *argv, "--name", child.name]
        with stops_held():  # (a stop before ``child.proc`` is set would leave the child out of ``stop``)
            if child.service == "redis":
                child.proc = self._spawner(start_redis, self.redis_port, log)  # (returns once it accepts: ready)
                child.ready_at = time.monotonic()
                return
            child.proc = self._spawner(spawn, cmd, log, {**self.env, **child.env})
        if child.service == "vision":
            self.vision_pids.add(child.proc.pid)

    @property
    def url(self) -> str:
        return local_url(self.host, self.port)  # (the gateway is bound to DAYZERO_HOST only)

    @property
    def redis(self):
        """The embedded Redis process (None with an external ``redis_url``)."""
        return next((c.proc for c in self.children if c.service == "redis"), None)

    def pids(self) -> set[int]:
        return {c.proc.pid for c in self.children if c.proc is not None}

    def wait_ready(
        self,
        timeout_s: float | None = 120,
        on_wait: Callable[[dict], None] | None = None,
        every_s: float = 10,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        """Until ``/ready`` answers 200 and no child is held back after quick exits, waiting or started and
        not ready yet (``Child.held_back``: another worker of its stage answers /ready for it), supervising
        (``timeout_s`` None: no limit). ``on_wait(body)``: ``/ready``'s latest answer (or the held child's
        line) every ``every_s``; ``on_restart(name)``: each child restarted meanwhile; a child that exits
        ``start_exits`` times first is a failed start (StartFailed, with the end of its log)."""
        reported, body = time.monotonic(), {}

        def restarted(name: str) -> None:
            if self.child(name).restarts >= self.start_exits:
                tail = self.log_tail(name)
                raise StartFailed(f"{name} keeps exiting while starting; the end of its log:\n{tail}")
            if on_restart is not None:
                on_restart(name)

        def ready() -> bool:
            nonlocal reported, body
            try:
                answer = httpx.get(f"{self.url}/ready", timeout=2)
                waiting = next((c for c in self.children if c.held_back()), None)
                if answer.status_code == 200 and waiting is None:
                    return True
                body = answer.json() if waiting is None else {"reason": waiting.restart_said()}
            except (httpx.HTTPError, ValueError):
                body = {"reason": "the gateway is starting"}
            if on_wait is not None and time.monotonic() - reported >= every_s:
                reported = time.monotonic()
                on_wait(body)
            return False

        if not self.supervised_until(ready, timeout_s, restarted):
            raise TimeoutError(f"the stack was not ready within {timeout_s} s (logs in {self.log_dir})")

    def until_ready(self, name: str, within_s: float = 120) -> None:
        """Supervise as ``up``'s loop does until child ``name`` (its exit waited for) runs ready again: its wait
        after a second quick exit over (one ``supervise()`` only notes it), started, seen ready. StartFailed,
        with its last restart and the end of its log, if not within ``within_s``."""
        child = self.child(name)
        running = lambda: child.proc.poll() is None and child.ready_at is not None
        if not self.supervised_until(running, within_s, lambda _: None):
            said = child.restart_said() if child.restarts else f"{name} starting"
            tail = self.log_tail(name)
            raise StartFailed(f"{name} did not run ready within {within_s:g} s ({said}); the end of its log:\n{tail}")

    def supervised_until(self, done: Callable[[], bool], timeout_s: float | None, on_restart: Callable) -> bool:
        """up's one loop: ``supervise()`` every ``SUPERVISE_EVERY_S`` (``on_restart`` with each child restarted)
        until ``done()``, False if not within ``timeout_s`` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while deadline is None or time.monotonic() < deadline:
            for name in self.supervise():
                on_restart(name)
            if done():
                return True
            time.sleep(SUPERVISE_EVERY_S)
        return False

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(text[-lines:]) + f"\n(whole log: {path})"

    def supervise(self) -> list[str]:
        """Restart children that exited (Redis on its own port; what is left of their process group
        SIGKILLed; one that keeps exiting before it has run a while ready once its wait is over) and frozen
        workers (``frozen``: each SIGKILLed first, with its process group, a tensor-parallel worker's other
        ranks in it); returns their names (each one's ``why``). Nothing once ``stop`` began (a pass from
        another thread restarted the children stop's SIGTERM had ended)."""
        with self._passes:
            return [] if self._stopping else self._supervised()

    def _supervised(self) -> list[str]:
        read = self.read_stamps()
        self._see_ready(read)
        restarted, frozen = [], {c.name: c for c in self.frozen(read)}
        for child in frozen.values():
            kill_group(child.proc)
        for child in self.children:
            if child.due is not None:  # (exited, waiting to start again)
                if time.monotonic() >= child.due:
                    child.due = None
                    self._spawn(child)
            elif child.proc is not None and child.proc.poll() is not None:
                self._left[child.proc.pid] = time.monotonic() + LEFT_GROUP_S
                froze = f"froze (no liveness stamp for {self.frozen_s:g} s)"
                child.why = froze if child.name in frozen else exited(child.proc.returncode)
                child.restarts += 1
                restarted.append(child.name)
                child.exited()
                if child.due is None:
                    self._spawn(child)
        gone = {pgid for pgid, at in self._left.items() if group_gone(pgid, at)}
        unlink_pools_by(gone)  # (its rank 0's pid: the segment's creator)
        self._left = {pgid: at for pgid, at in self._left.items() if pgid not in gone}
        return restarted

    def read_stamps(self) -> StampRead | None:
        """This pass's one read of the stamps (stack_stamps.py): when a worker starts (``_see_ready``) or
        frozen ones are restarted (``frozen_s``); a late one marks ``_unread_at``. None: no read needed."""
        starting = any(c.ready_at is None and c.service in SERVICES[1:] for c in self.children)
        if self.redis_url is None or not (starting or self.frozen_s):
            return None
        self._stamps = self._stamps or StampReader(connect(self.redis_url), same_clock=self.redis_port is not None)
        read = self._stamps.read(bool(self.frozen_s), self.children)
        if read.late:  # (till its write's answer too: a write held, CLIENT PAUSE WRITE, held the stamps)
            self._unread_at = time.monotonic()
        return read

    def _see_ready(self, read: StampRead | None) -> None:
        """Note when each running child not seen ready yet is (``Child.ready_at``): the gateway once it
        answers ``/health``, a worker once a ready stamp since its spawn names its process (liveness.py);
        the embedded Redis is once it accepts (``_spawn``). Nothing is seen while Redis cannot be read."""
        starting = [c for c in self.children if c.ready_at is None and c.proc is not None and c.proc.poll() is None]
        for child in starting:
            if child.service == "gateway":
                with contextlib.suppress(httpx.HTTPError):
                    ready = httpx.get(f"{self.url}/health", timeout=1).status_code == 200
                    child.ready_at = time.monotonic() if ready else None
            elif read is not None and child.service in read.stages:
                child.ready_at = read.ready_seen(child)

    def frozen(self, read: StampRead | None = None) -> list[Child]:
        """The running workers whose last liveness stamp is older than ``frozen_s`` (``stack_stamps.stale``),
        by ``read`` (this pass's; None: a read of its own): SIGSTOPped, or hung in a step past its bound. No
        stamp ages while Redis cannot be read, answers late or refuses writes (``StampRead.late``: the stamps
        are writes; all workers were killed at once when it answered again)."""
        read = (read or self.read_stamps()) if self.frozen_s else None
        return [] if read is None or read.late else stale(read, self.children, self.frozen_s, self._unread_at)

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def stop(self) -> list[str]:
        """Gateway, then workers, then Redis: each group SIGTERMed, SIGKILLed after ``stop_timeout_s``.
        The pool segments of the workers killed so go too (``unlink_pools_by``), and with its own
        Redis the image embeddings its vision workers parked (the requests queued to read them went
        with the Redis). Returns the names of the children SIGKILLed. (A ``supervise`` pass under way
        in another thread ends first; none restarts a child after.)"""
        with self._passes:
            self._stopping = True
        killed = []
        for group in (("gateway",), ("vision", "prefill", "decode"), ("redis",)):
            members = [c for c in self.children if c.service in group and c.proc is not None]
            gone = terminate([c.proc for c in members], self.stop_timeout_s)
            killed += [c.name for c in members if c.proc in gone]
        unlink_pools_by([*self.pids(), *self._left])  # (every child exited: SIGKILLed with its group if not)
        if self.redis_port is not None:
            unlink_parked_by(self.vision_pids)
        self._spawner.close()
        return killed
