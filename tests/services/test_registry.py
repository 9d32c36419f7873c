"""The worker registry on a real Redis: /ready's count of live workers, /metrics' snapshots."""

from __future__ import annotations

import json
import time

import redis

from dayzero.serving.keys import key
from dayzero.serving.registry import FORGET_S, Registry


def test_a_restarted_worker_counts_once_and_long_silent_processes_are_forgotten(redis_url):
    """Each process beats under its worker's name and a suffix of its own (its leases are its own):
    a worker killed and restarted has two entries for a while, and one worker is all it is."""
    registry, now = Registry(redis.Redis.from_url(redis_url)), time.time()
    beats = {
        "decode0@a:dead01": now - 2,  # killed 2 s ago, within the liveness window
        "decode0@a:new002": now - 0.5,  # its restart
        "decode1@a:1a2b3c": now - 1,
        "decode0@b:4d5e6f": now - 30,  # another host's, silent past the window
        "decode2@a:0f0f0f": now - FORGET_S - 1,  # crash-looped long ago
    }
    registry.r.hset(key("workers", "stage-x"), mapping=beats)
    assert registry.live_workers("stage-x", 11) == ["decode0@a:new002", "decode1@a:1a2b3c"]
    kept = {k.decode() for k in registry.r.hkeys(key("workers", "stage-x"))}
    assert kept == set(beats) - {"decode2@a:0f0f0f"}


def test_metrics_show_a_restarted_worker_once(redis_url):
    """A worker killed and restarted: its new process's snapshot, not also the dead one's (which
    stays in Redis for a minute); a worker that died without a restart keeps its last snapshot."""
    registry, now = Registry(redis.Redis.from_url(redis_url)), time.time()
    beats = {"prefill0@a:dead01": now - 2, "prefill0@a:new002": now - 0.5, "prefill1@a:alone3": now - 20}
    registry.r.hset(key("workers", "stage-y"), mapping=beats)
    for process in beats:
        registry.r.set(key("usage", process), json.dumps({"stage": "stage-y", "gauges": {"weights": 7}}), ex=60)
    try:
        shown = sorted(name for name in registry.snapshots() if name in beats)  # (the Redis is shared)
        assert shown == ["prefill0@a:new002", "prefill1@a:alone3"]
    finally:
        registry.r.delete(*(key("usage", process) for process in beats))
