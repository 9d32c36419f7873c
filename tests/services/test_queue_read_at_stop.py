"""A stopping worker's queue read (``broker.QueueReads.end_at_stop``): Celery checks its stop flag
between two reads of its queue, so a stop that lands after the check finds no read blocked in Redis
yet; the read sent next waited its whole poll (1 s) before Celery saw the stop. Real Redis; the
consumer is a client that reads as kombu's does (BRPOP, named as the worker's connections)."""

from __future__ import annotations

import threading

import redis

from dayzero.serving.broker import QueueReads

from .conftest import wait_until


def test_a_read_sent_just_after_the_stop_began_is_ended(redis_url):
    reads, r = QueueReads(), redis.Redis.from_url(redis_url)
    consumer = redis.Redis.from_url(redis_url, client_name=reads.name)
    consumer.ping()
    reads.end_at_stop(r)  # (no read blocked: the consumer between its stop check and its next read)
    answered = threading.Event()

    def read_next() -> None:
        consumer.brpop(["queue-at-stop"], timeout=0)  # (0: for ever, where kombu's waits 1 s)
        answered.set()

    threading.Thread(target=read_next, daemon=True).start()
    try:
        assert answered.wait(30)
    finally:
        r.lpush("queue-at-stop", b"x")  # (ends the read if it still waits)


def test_a_read_blocked_at_the_stop_is_ended_at_once(redis_url):
    reads, r = QueueReads(), redis.Redis.from_url(redis_url)
    consumer = redis.Redis.from_url(redis_url, client_name=reads.name)
    answered = threading.Event()
    threading.Thread(target=lambda: (consumer.brpop(["queue-blocked"], timeout=0), answered.set()), daemon=True).start()
    blocked = lambda: any(c.get("name") == reads.name and "b" in c["flags"] for c in r.client_list())  # noqa: E731
    try:
        assert wait_until(blocked, 30)
        reads.end_at_stop(r)
        assert answered.wait(30)
    finally:
        r.lpush("queue-blocked", b"x")
