"""A worker's consumer whose Redis becomes unreachable (its packets dropped: connections hang, none is
refused) takes work again within seconds of Redis being reachable (was: ~16-25 s after a 30 s cut: its
queue read, whose reply was dropped, waited for Redis's TCP retransmission or kombu's check every 25 s,
and its connects for the kernel's SYN retries). Real Redis in a network namespace
(tests/services/unreachable.py: root and ``ip netns`` needed, skipped otherwise), a real Celery worker
process on dayzero's app (tests/services/reconnecting.py). Both ways to lose it: its link down, and a
partition (links up, every packet dropped both ways)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from .conftest import stopped, wait_until
from .reconnecting import QUEUE, touching_app
from .test_reconnect import ROOT
from .unreachable import netns_usable, partition_usable, unreachable_redis

pytestmark = pytest.mark.skipif(not netns_usable(), reason="needs root and ip netns (a Redis made unreachable)")
CUT_S = 30.0  # Redis's replies retransmitted ~25 s into it, next at ~51 s; kombu's check every 25 s
SERVED_WITHIN_S = 10.0  # after Redis is reachable again (its bounds: a 2 s connect, a read 6-11 s overdue)


@pytest.mark.parametrize("partitioned", [False, True], ids=["link-down", "partitioned"])
def test_a_worker_consumes_again_within_seconds_once_an_unreachable_redis_is_reachable(tmp_path, partitioned):
    if partitioned and not partition_usable():
        pytest.skip("needs tc (a partition's qdiscs)")
    log, mark = tmp_path / "worker.log", tmp_path / "touched"
    with unreachable_redis(tmp_path / "redis.log", partitioned=partitioned) as redis_server:
        cmd = [sys.executable, "-m", "tests.services.reconnecting", redis_server.url]
        worker = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: "ready." in log.read_text(), 60), log.read_text()
            time.sleep(2.0)  # (its queue read blocked in Redis)
            redis_server.cut()
            time.sleep(CUT_S)
            redis_server.mend()
            reachable = time.monotonic()
            touching_app(redis_server.url).send_task("touch", args=[str(mark)], queue=QUEUE)
            assert wait_until(mark.exists, 60), log.read_text()[-3000:]
            took_s = time.monotonic() - reachable
        finally:
            stopped(worker)
    assert took_s < SERVED_WITHIN_S, (took_s, log.read_text()[-3000:])
    assert "Unrecoverable error" not in log.read_text()
