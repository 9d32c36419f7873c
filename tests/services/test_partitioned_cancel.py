"""A stream the gateway ended because a two-way partition cut it from Redis (``queue_unavailable``) has
its request cancelled as soon as Redis answers again (was: at its unwatch's next try, the pauses between
tries doubling to 5 s, each try a 2 s connect: 4-7 s after Redis was back, ~150-190 of the demo's tokens
decoded for nobody after a 30 s partition, bench/hung_redis.py --faults partitioned). Real Redis in a
network namespace (tests/services/unreachable.py: root, ``ip`` and ``tc``), a gateway, a prefill and a
decode worker. Redis comes back just as the unwatch's fifth try has failed (its next 3.2 s or more
away): the first ends with the gateway's log line, the others are the gateway's connects that ``ss``
shows lasting the connect's bound (the probe's own PINGs give up on theirs sooner)."""

from __future__ import annotations

import subprocess
import time
from urllib.parse import urlparse

import pytest
import redis

from dayzero.serving.keys import key
from services.gateway.held_loop import CONNECT_S
from services.gateway.leaving import PROBE_S

from .conftest import start_stack, wait_until
from .test_lost_stream_cancel import SETTINGS, Reader
from .unreachable import partition_usable, unreachable_redis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not partition_usable(), reason="needs root, ip netns and tc (a partitioned Redis)"),
]
FAILED_TRIES = 5  # the unwatch's: the pause after the last is 3.2 s (0.2 s doubling)
CANCELLED_WITHIN_S = 2.5  # (a PING a second at most till Redis answers, then the unwatch and the cancel)
# A connect under way this long is a try's, timed out at CONNECT_S; the probe's are cancelled at PROBE_S.
TRY_CONNECT_S = (PROBE_S + CONNECT_S) / 2
POLL_S = 0.05


def connects(pid: int, host: str) -> set[str]:
    """The local ports of process ``pid``'s connects to ``host`` under way (their SYNs unanswered)."""
    out = subprocess.run(["ss", "-tnpH", "state", "syn-sent", "dst", host], capture_output=True, text=True).stdout
    return {line.split()[2].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={pid}," in line}


def failed_try_connects(pid: int, host: str, count: int, timeout_s: float) -> bool:
    """Whether ``count`` of ``pid``'s connects to ``host`` that lasted ``TRY_CONNECT_S`` or more ended
    (from now) within ``timeout_s``; True once the last of them has."""
    began: dict[str, float] = {}  # connects under way: when first seen, by local port
    deadline = time.monotonic() + timeout_s
    while count and time.monotonic() < deadline:
        now, under_way = time.monotonic(), connects(pid, host)
        for port in began.keys() - under_way:
            if now - began.pop(port) >= TRY_CONNECT_S:
                count -= 1
        began.update({port: now for port in under_way - began.keys()})
        time.sleep(POLL_S)
    return not count


def test_a_stream_ended_by_a_partition_has_its_request_cancelled_once_redis_answers(text_dir, tmp_path):
    with unreachable_redis(tmp_path / "redis.log", partitioned=True) as server:
        # no lease lapses in the partition, and the reaper's first pass (its 2 s connects) comes 45 s on, after it
        settings = {**SETTINGS, "DAYZERO_LEASE_S": "90"}
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
                failed = f"request {reader.rid}: its unwatch failed"  # (its first try: a command's or a connect's)
                assert wait_until(lambda: failed in stack.log_tail("gateway", 200), 30)
                assert failed_try_connects(gateway, host, FAILED_TRIES - 1, 40)  # its leave's unwatch tried again
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
