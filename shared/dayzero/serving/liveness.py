"""A worker process's liveness, apart from its work.

The loops' heartbeats (registry.py's presence, lease.py's leases) come from the work itself: a
long step stops them (a million-token prefill forward may rightly run for many minutes). A
``Pulse`` thread stamps "this process runs" instead, every ``STAMP_EVERY_S``, from before the
worker loads its weights: SIGSTOP or a process that no longer runs stops it, a forward however
long does not. A step past its bound (``lease.Heartbeat.stuck``: its leases already lapsed) stops
it too, on purpose: that worker is as good as frozen; and so does a stopped child (a
tensor-parallel worker's other ranks are its rank 0's children): the group's next collective waits
on it until the group's timeout.

Keys (prefix ``dz:``): alive:{stage}, a hash of process ("{host}:{pid}") -> the time of its last
stamp; unserved:{stage}, since when the stage has had no live process (set by the gateway).
Readers: ``dayzero up`` restarts a worker whose stamp is older than DAYZERO_FROZEN_WORKER_S
(stack.py); the gateway ends the requests waiting at a stage that has had no live process for
DAYZERO_NO_WORKER_TIMEOUT_S (reaper.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from .keys import key

log = logging.getLogger("dayzero.liveness")
STAMP_EVERY_S = 1.0
FRESH_S = 3.0  # a stage whose newest stamp is older has no live process
FORGET_S = 600.0  # stamps this old are dropped (a restarted process stamps under a new pid)


def process_id(pid: int | None = None, host: str | None = None) -> str:
    """A worker process as its stamps name it (``up`` names its children the same way)."""
    return f"{host or socket.gethostname()}:{pid or os.getpid()}"


def stopped_child(pid: int | None = None) -> bool:
    """A child of process ``pid`` (this one) is stopped (SIGSTOP, or held by a tracer); False where
    /proc lists no children (not Linux)."""
    for children in Path(f"/proc/{pid or os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # a thread or child that ended meanwhile
            for child in children.read_text().split():
                state = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0]
                if state in ("T", "t"):
                    return True
    return False


def connect(url: str) -> redis.Redis:
    """A client that gives up quickly: a stamp or a check never waits long on a hung Redis."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


class Pulse:
    """Stamps this process alive in ``stage``'s hash until ``stop``, unless ``stuck()`` says its
    step has run past its bound (``watch`` sets it once the stage is built) or a child of it (a
    rank) is stopped."""

    def __init__(self, client: redis.Redis, stage: str) -> None:
        self.r, self.stage, self.process = client, stage, process_id()
        self._stuck: Callable[[], bool] = lambda: False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> Pulse:
        self._thread.start()
        return self

    def watch(self, stuck: Callable[[], bool]) -> None:
        self._stuck = stuck

    def _run(self) -> None:
        said = None
        while True:
            why = "a step ran past its bound" if self._stuck() else "a rank is stopped" if stopped_child() else None
            if why is not None and why != said:
                log.error("%s: no more liveness stamps (dayzero up restarts the worker)", why)
            said = why
            if why is None:  # Redis restarting: the next stamp retries (up counts no staleness while it cannot read)
                with contextlib.suppress(redis.RedisError):
                    self.r.hset(key("alive", self.stage), self.process, time.time())
            if self._stop.wait(STAMP_EVERY_S):
                return

    def stop(self) -> None:
        """No more stamps, and out of the hash: a stopping worker serves no new request."""
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            self.r.hdel(key("alive", self.stage), self.process)


def stamps(client: redis.Redis, stage: str) -> dict[str, float]:
    """Each process's last stamp in ``stage`` (those older than ``FORGET_S`` leave the hash)."""
    found = {p.decode(): float(t) for p, t in client.hgetall(key("alive", stage)).items()}
    gone = [p for p, t in found.items() if time.time() - t > FORGET_S]
    if gone:
        client.hdel(key("alive", stage), *gone)
    return {p: t for p, t in found.items() if p not in gone}


def unserved_for(client: redis.Redis, stage: str) -> float:
    """How long ``stage`` has had no live process (0: it has one now), counted from the first call
    that found none (not from its last stamp: after Redis itself was down or frozen every stamp is
    old, until the workers stamp again within a second)."""
    now = time.time()
    if any(now - t <= FRESH_S for t in stamps(client, stage).values()):
        client.delete(key("unserved", stage))
        return 0.0
    client.set(key("unserved", stage), now, nx=True)
    since = client.get(key("unserved", stage))
    return now - float(since) if since else 0.0
