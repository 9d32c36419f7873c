"""Workers in Redis: heartbeats per stage, pool usage and metrics snapshots, loading progress, and
the depth of each stage's Celery queue (keys: see lifecycle.py).

The heartbeats are on Redis's clock (redis_clock.py), written and read: a worker on a host whose
clock was a lease behind its peer's was never live to it (no request handed back to it, whatever
room it had), one ahead stayed live that long after it stopped (requests handed back to a dead
peer); ``/ready`` compared the settings of only the workers whose hosts' clocks agreed with its.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable

import redis

from .keys import key
from .redis_clock import NOW, hashes_at

FORGET_S = 600.0  # a worker process silent this long is forgotten
SNAPSHOT_S = 60  # a worker's snapshot lapses this long after its last beat

# A beat at Redis's time (KEYS: workers:{stage}, usage:{worker}; ARGV: the worker, its snapshot
# ("": none), how long the snapshot lasts).
BEAT = (
    NOW
    + """
redis.call('HSET', KEYS[1], ARGV[1], now)
if ARGV[2] ~= '' then
    redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
end
"""
)


def process_name(worker: str) -> str:
    """A worker process's name in leases and heartbeats: the worker's, and a ``:suffix`` of its
    own (a restarted process is a new one standing for the same worker)."""
    return f"{worker}:{uuid.uuid4().hex[:6]}"


class Registry:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._beat = client.register_script(BEAT)

    def alive(self, stage: str, worker: str, usage: dict | None = None) -> None:
        """A beat of ``worker``, with its snapshot ``usage``, in one round trip."""
        snapshot = "" if usage is None else json.dumps(usage)
        self._beat(keys=[key("workers", stage), key("usage", worker)], args=[worker, snapshot, SNAPSHOT_S])

    def leave(self, stage: str, worker: str) -> None:
        pipe = self.r.pipeline()
        pipe.hdel(key("workers", stage), worker)
        pipe.delete(key("usage", worker))
        pipe.execute()

    def loading(
        self, worker: str, stage: str, percent: int | None, process: str | None = None, started: float = 0.0
    ) -> None:
        """A starting worker's weight-loading progress (None: done); lapses if the worker dies.
        ``process``: its liveness stamps' name, and ``started``: when this start of it began (its host's
        clock), by which ``/ready`` leaves out a dead start's (readiness._loading). Done, the entries
        of the process's earlier starts go too (dead: a restarted container's pid 1 again): left the
        only entry of the process, one was listed as loading while the new start warmed up."""
        if percent is None:
            found = self.loading_workers() if process else {}
            earlier = [w for w, p in found.items() if p.get("process") == process]
            self.r.delete(*{key("loading", w) for w in (worker, *earlier)})
        else:
            progress = {"stage": stage, "percent": percent, **({"process": process} if process else {})}
            self.r.set(key("loading", worker), json.dumps({**progress, "started": started}), ex=120)

    def loading_workers(self) -> dict[str, dict]:
        return {name: json.loads(v) for name, v in self._family("loading").items()}

    def live_workers(self, stage: str, within_s: float) -> list[str]:
        """The stage's workers that beat within ``within_s`` (by Redis's clock): one per worker, a
        restarted process (the same name, a new ``:suffix``) standing for the one it replaced;
        processes silent for ``FORGET_S`` leave the registry (a crash-looping worker would add one a
        restart)."""
        now, (found,) = hashes_at(self.r, key("workers", stage))
        beats = {w.decode(): float(t) for w, t in found.items()}
        gone = [w for w, t in beats.items() if now - t > FORGET_S]
        if gone:
            self.r.hdel(key("workers", stage), *gone)
        latest: dict[str, tuple[float, str]] = {}
        for process, t in beats.items():
            worker = process.rpartition(":")[0] or process
            if now - t <= within_s and t > latest.get(worker, (0.0, ""))[0]:
                latest[worker] = (t, process)
        return sorted(process for _, process in latest.values())

    def queue_depths(self, stages: tuple[str, ...]) -> dict[str, int]:
        """Messages waiting in each stage's Celery queue (a Redis list named after the queue)."""
        pipe = self.r.pipeline()
        for stage in stages:
            pipe.llen(stage)
        return dict(zip(stages, pipe.execute(), strict=True))

    def snapshots(self) -> dict[str, dict]:
        """Every worker's latest metrics snapshot: a restarted worker's, not also the one of the
        process it replaced (its key lasts a minute: the weights it checked, its blocks and memory
        counted twice meanwhile)."""
        found = {name: json.loads(v) for name, v in self._family("usage").items()}
        stages = {snap.get("stage", "") for snap in found.values()}
        current = {process for stage in stages for process in self.live_workers(stage, FORGET_S)}
        return {name: snap for name, snap in found.items() if name in current}

    def snapshots_of(self, processes: list[str]) -> dict[str, dict]:
        """The latest snapshot of each of these worker processes (none yet: left out)."""
        values = self.r.mget([key("usage", p) for p in processes]) if processes else []
        return {p: json.loads(v) for p, v in zip(processes, values, strict=True) if v}

    def _family(self, family: str) -> dict[str, bytes]:
        keys = list(self.r.scan_iter(key(family, "*"), count=100))
        values = self.r.mget(keys) if keys else []
        prefix = len(key(family, "*")) - 1  # "dz:{family}:"
        return {k.decode()[prefix:]: v for k, v in zip(keys, values, strict=True) if v}


class Presence:
    """A worker process's entry in the registry, beaten until it leaves: a worker stopping (SIGTERM)
    is out of ``/ready``'s count and the metrics at once, where its last beat would count it for
    three leases and its entry stay ``FORGET_S``."""

    def __init__(self, registry: Registry, stage: str, worker: str) -> None:
        self.registry, self.stage, self.worker = registry, stage, worker
        self._left = False
        self._lock = threading.Lock()  # a beat under way ends before the entry goes

    def beat(self, usage: Callable[[], dict]) -> None:
        with self._lock:
            if not self._left:
                self.registry.alive(self.stage, self.worker, usage())

    def leave(self) -> None:
        with self._lock, contextlib.suppress(redis.RedisError):  # Redis down: it lapses as a dead one's
            self._left = True
            self.registry.leave(self.stage, self.worker)
