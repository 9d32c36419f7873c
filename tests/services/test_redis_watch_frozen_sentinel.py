"""``dayzero up``'s Redis watch behind a frozen sentinel (SIGSTOP, then SIGCONT; all real processes):
each ping asks the sentinel for the master and waits out its timeout (2 s). The ping was sent inline
from up's loop, which stood still as long each pass: no exited worker restarted meanwhile."""

from __future__ import annotations

import signal
import time

from dayzero import redis_watch
from dayzero.redis_urls import _SENTINEL_ASKED_S
from dayzero.redis_watch import RedisWatch

from .sentinel_group import sentinel_group


def test_a_frozen_sentinel_holds_up_no_check_and_is_still_said(tmp_path, monkeypatch):
    monkeypatch.setattr(redis_watch, "CHECK_EVERY_S", 0.2)
    said: list[str] = []
    with sentinel_group(tmp_path) as group:
        sentinel = group.procs["sentinel"]
        sentinel.send_signal(signal.SIGSTOP)  # (every new connection asks it: each ping waits _SENTINEL_ASKED_S)
        try:
            watch = RedisWatch(group.url(), said.append)
            longest, until = 0.0, time.monotonic() + 2 * _SENTINEL_ASKED_S + 1
            while time.monotonic() < until:
                began = time.monotonic()
                watch.check()
                longest = max(longest, time.monotonic() - began)
                time.sleep(0.05)
            lost = list(said)
        finally:
            sentinel.send_signal(signal.SIGCONT)
        until = time.monotonic() + 3 * _SENTINEL_ASKED_S
        while len(said) < 2 and time.monotonic() < until:
            watch.check()
            time.sleep(0.05)
    # a check that waited for its ping took the sentinel's whole timeout; one that does not, a thread's start
    assert longest < _SENTINEL_ASKED_S / 2, f"a check took {longest:.2f} s: it waited for its ping"
    assert len(lost) == 1 and lost[0].startswith(f"redis {group.url()} lost: no sentinel "), lost
    assert len(said) == 2 and said[1].startswith(f"redis {group.url()} back after "), said
