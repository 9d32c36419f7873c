"""Workers in Redis: heartbeats per stage, pool usage and metrics snapshots, loading progress, and
the depth of each stage's Celery queue (keys: see lifecycle.py)."""

from __future__ import annotations

import json
import time

import redis

from .lifecycle import key


class Registry:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def alive(self, stage: str, worker: str, usage: dict | None = None) -> None:
        pipe = self.r.pipeline()
        pipe.hset(key("workers", stage), worker, time.time())
        if usage is not None:
            pipe.set(key("usage", worker), json.dumps(usage), ex=60)
        pipe.execute()

    def loading(self, worker: str, stage: str, percent: int | None) -> None:
        """A starting worker's weight-loading progress (None: done); lapses if the worker dies."""
        if percent is None:
            self.r.delete(key("loading", worker))
        else:
            self.r.set(key("loading", worker), json.dumps({"stage": stage, "percent": percent}), ex=120)

    def loading_workers(self) -> dict[str, dict]:
        return {name: json.loads(v) for name, v in self._family("loading").items()}

    def live_workers(self, stage: str, within_s: float) -> list[str]:
        now = time.time()
        beats = self.r.hgetall(key("workers", stage))
        return [w.decode() for w, t in beats.items() if now - float(t) <= within_s]

    def queue_depths(self, stages: tuple[str, ...]) -> dict[str, int]:
        """Messages waiting in each stage's Celery queue (a Redis list named after the queue)."""
        pipe = self.r.pipeline()
        for stage in stages:
            pipe.llen(stage)
        return dict(zip(stages, pipe.execute(), strict=True))

    def snapshots(self) -> dict[str, dict]:
        """Every live worker's latest metrics snapshot."""
        return {name: json.loads(v) for name, v in self._family("usage").items()}

    def _family(self, family: str) -> dict[str, bytes]:
        keys = list(self.r.scan_iter(key(family, "*"), count=100))
        values = self.r.mget(keys) if keys else []
        prefix = len(key(family, "*")) - 1  # "dz:{family}:"
        return {k.decode()[prefix:]: v for k, v in zip(keys, values, strict=True) if v}
