"""A stream the gateway ended because a two-way partition cut it from Redis (``queue_unavailable``) has
its request cancelled as soon as Redis answers again (was: at its unwatch's next try, the pauses between
tries doubling to 5 s, each try a 2 s connect: 4-7 s after Redis was back, ~150-190 of the demo's tokens
decoded for nobody after a 30 s partition, bench/hung_redis.py --faults partitioned). Real Redis in a
network namespace (tests/services/unreachable.py: root, ``ip`` and ``tc``), a gateway, a prefill and a
decode worker; ``ss`` shows the gateway's connects to Redis (its tries), so Redis comes back just as one
has failed."""

from __future__ import annotations

import subprocess
import time
from urllib.parse import urlparse

import pytest
import redis

from dayzero.serving.keys import key

from .conftest import start_stack, wait_until
from .test_lost_stream_cancel import SETTINGS, Reader
from .unreachable import partition_usable, unreachable_redis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not partition_usable(), reason="needs root, ip netns and tc (a partitioned Redis)"),
]
FAILED_CONNECTS = 5  # the gateway's tries that failed on a connect: the pause after the last is 3.2 s or more
CANCELLED_WITHIN_S = 2.5  # (a PING a second at most till Redis answers, then the unwatch and the cancel)


def connecting(pid: int, host: str) -> bool:
    """Whether process ``pid`` has a connect to ``host`` under way (its SYN unanswered)."""
    out = subprocess.run(["ss", "-tnpH", "state", "syn-sent", "dst", host], capture_output=True, text=True).stdout
    return f"pid={pid}," in out


def test_a_stream_ended_by_a_partition_has_its_request_cancelled_once_redis_answers(text_dir, tmp_path):
    with unreachable_redis(tmp_path / "redis.log", partitioned=True) as server:
        settings = {**SETTINGS, "DAYZERO_LEASE_S": "90"}  # (no lease lapses in the partition)
        stack = start_stack(
            text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, settings, redis_url=server.url
        )
        gateway, host = next(c.proc.pid for c in stack.children if c.name == "gateway"), urlparse(server.url).hostname
        try:
            reader = Reader(stack.url)
            reader.start()
            assert wait_until(lambda: int(reader.last.split("-")[0]) >= 5, 60)  # (decode generates it)
            server.cut()
            try:
                reader.join(40)  # the read unanswered past its block + 4 s (SETTINGS): the stream ends
                for _ in range(FAILED_CONNECTS):  # its leave's unwatch tried again and again
                    assert wait_until(lambda: connecting(gateway, host), 30)
                    assert wait_until(lambda: not connecting(gateway, host), 10)
            finally:
                server.mend()
            back, r = time.monotonic(), redis.Redis.from_url(server.url)
            assert not reader.is_alive() and reader.error == "queue_unavailable"
            assert wait_until(lambda: r.exists(key("cancel", reader.rid)), 30)
            took_s = time.monotonic() - back
            assert wait_until(lambda: r.get(key("done", reader.rid)) == b"cancelled", 20)
        finally:
            stack.stop()
    assert took_s < CANCELLED_WITHIN_S, took_s  # (was: its next try, 3.2 s or more on)
