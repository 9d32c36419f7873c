"""The heartbeat against a real Redis: held leases stay alive, released and finished ones lapse."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.serving.lease import Heartbeat
from dayzero.serving.lifecycle import Lifecycle


def test_one_thread_keeps_held_leases_alive_until_they_are_released(redis_url):
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    beat = Heartbeat(store, "prefill0", 0.3, stop)
    for rid in ("h1", "h2"):
        store.take(rid, 0, "prefill0", 0.3)  # claimed, as a stage claims what it works on
    try:
        with beat.holding(["h1", "h2"]):
            time.sleep(0.5)  # past one lease: only beats keep them
            assert store.owner("h1") == store.owner("h2") == "prefill0"
            beat.release("h2")
            time.sleep(0.5)
            assert store.owner("h1") == "prefill0" and store.owner("h2") is None
            store.take("h3", 0, "prefill0", 0.3)
            with beat.holding(["h3"]):  # a second batch on the same thread
                time.sleep(0.5)
                assert store.owner("h3") == "prefill0"
        time.sleep(0.5)
        assert store.owner("h1") is None and store.owner("h3") is None
    finally:
        stop.set()
    beats = [t for t in threading.enumerate() if t.name == "heartbeat"]
    assert len(beats) == 1  # one thread for both batches; it ends with the stop
    beats[0].join(2)
    assert not beats[0].is_alive()
