"""A worker's consumer whose Redis becomes unreachable (its packets dropped: connections hang, none is
refused) takes work again within seconds of Redis being reachable (was: ~16-25 s after a 30 s cut: its
queue read, whose reply was dropped, waited for Redis's TCP retransmission or kombu's check every 25 s,
and its connects for the kernel's SYN retries). Real Redis in a network namespace
(tests/services/unreachable.py: root and ``ip netns`` needed, skipped otherwise), a real Celery worker
process on dayzero's app (tests/services/reconnecting.py). Both ways to lose it: its link down, and a
partition (links up, every packet dropped both ways), cut and mended at once (each its own Redis and
worker): the cut's 30 s pass once for both."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack

import pytest
import redis

from .conftest import stopped, wait_until
from .reconnecting import QUEUE, touching_app
from .test_reconnect import ROOT
from .unreachable import netns_usable, partition_usable, unreachable_redis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not netns_usable(), reason="needs root and ip netns (a Redis made unreachable)"),
]
CUT_S = 30.0  # Redis's replies retransmitted ~25 s into it, next at ~51 s; kombu's check every 25 s
SETTLE_S = 2.0  # after the workers' reads block, before the cut (the phase of kombu's check: below)
SERVED_WITHIN_S = 10.0  # after Redis is reachable again (its bounds: a 2 s connect, a read 6-11 s overdue)
WAYS = {"link-down": False, "partitioned": True}  # way -> unreachable_redis's ``partitioned``


def reading(url: str) -> bool:
    """Whether a client of the Redis at ``url`` waits in a blocked queue read (a worker's BRPOP)."""
    with redis.Redis.from_url(url) as r:
        return any(c["cmd"] == "brpop" and "b" in c["flags"] for c in r.client_list())


@pytest.fixture(scope="module")
def reconnects(tmp_path_factory) -> dict[str, tuple[float, str]]:
    """Way (those usable here) -> seconds its worker took to run a task sent once its Redis was
    reachable again, and the worker's log."""
    ways = [way for way, partitioned in WAYS.items() if not partitioned or partition_usable()]
    logs, marks, servers, workers = {}, {}, {}, {}
    with ExitStack() as cleanup:
        for way in ways:
            tmp = tmp_path_factory.mktemp(way)
            logs[way], marks[way] = tmp / "worker.log", tmp / "touched"
            servers[way] = cleanup.enter_context(unreachable_redis(tmp / "redis.log", partitioned=WAYS[way]))
            cmd = [sys.executable, "-m", "tests.services.reconnecting", servers[way].url]
            workers[way] = subprocess.Popen(cmd, cwd=ROOT, stdout=logs[way].open("w"), stderr=subprocess.STDOUT)
            cleanup.callback(stopped, workers[way])
        for way in ways:
            assert wait_until(lambda way=way: "ready." in logs[way].read_text(), 60), logs[way].read_text()
        for way in ways:  # (their queue reads blocked in Redis)
            assert wait_until(lambda way=way: reading(servers[way].url), 30), logs[way].read_text()
        # and SETTLE_S on: cut at once (the reads block by "ready."), kombu's own BRPOP check (every
        # 25 s, its default: a worker without the hang bounds) fell ~1 s after the mend, and link-down
        # passed without them (served 0.6-1 s after; 18 s with this)
        time.sleep(SETTLE_S)
        for way in ways:
            servers[way].cut()
        time.sleep(CUT_S)
        for way in ways:
            servers[way].mend()
        reachable = time.monotonic()
        for way in ways:
            touching_app(servers[way].url).send_task("touch", args=[str(marks[way])], queue=QUEUE)
        took_s = {}

        def all_served() -> bool:  # (each timed as its mark appears)
            for way in set(ways) - set(took_s):
                if marks[way].exists():
                    took_s[way] = time.monotonic() - reachable
            return len(took_s) == len(ways)

        assert wait_until(all_served, 60), [logs[way].read_text()[-3000:] for way in ways if way not in took_s]
    return {way: (took_s[way], logs[way].read_text()) for way in ways}


@pytest.mark.parametrize("way", WAYS)
def test_a_worker_consumes_again_within_seconds_once_an_unreachable_redis_is_reachable(reconnects, way):
    if WAYS[way] and not partition_usable():
        pytest.skip("needs tc (a partition's qdiscs)")
    took_s, log = reconnects[way]
    assert took_s < SERVED_WITHIN_S, (took_s, log[-3000:])
    assert "Unrecoverable error" not in log
