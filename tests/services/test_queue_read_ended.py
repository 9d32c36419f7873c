"""A worker's queue read ended when the worker takes no more messages (``queue_reads.QueueReads.
end_now_or_next``): when it begins to stop, and when it pauses before a hand back (room.py's
``Prefetch.withhold``). Celery sees either between two reads of its queue, so one that lands after
its check finds no read blocked in Redis yet; the read sent next waited its whole poll (1 s) before
Celery saw it (and took the next message pushed meanwhile: a paused worker held it unstarted). Real
Redis; the consumer is a client that reads as kombu's does (BRPOP, named as the worker's connections)."""

from __future__ import annotations

import threading

import redis
from kombu.common import QoS

from dayzero.serving.queue_reads import QueueReads
from dayzero.serving.room import Prefetch

from .conftest import wait_until


def _read_sent_next_is_answered(reads: QueueReads, redis_url: str, told, queue: str) -> bool:
    """``told(client)`` with no read blocked (the consumer between its check and its next read), then
    the consumer's next read: -> whether it was answered (ended) within 30 s."""
    r, consumer = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url, client_name=reads.name)
    consumer.ping()
    told(r)
    answered = threading.Event()

    def read_next() -> None:
        consumer.brpop([queue], timeout=0)  # (0: for ever, where kombu's waits 1 s)
        answered.set()

    threading.Thread(target=read_next, daemon=True).start()
    try:
        return answered.wait(30)
    finally:
        r.lpush(queue, b"x")  # (ends the read if it still waits)


def test_a_read_sent_just_after_the_stop_began_is_ended(redis_url):
    reads = QueueReads()
    assert _read_sent_next_is_answered(reads, redis_url, reads.end_now_or_next, "queue-at-stop")


class _Consumer:
    """Celery's consumer as ``Prefetch`` sees it: its prefetch and its QoS (kombu's), which Celery's
    event loop applies between polls (here: never; the consumer is the test's client)."""

    def __init__(self, prefetch: int) -> None:
        self.initial_prefetch_count, self.qos = prefetch, QoS(lambda prefetch_count: None, prefetch)


def _looking(reads: QueueReads) -> bool:
    return f"end-{reads.name}" in [thread.name for thread in threading.enumerate()]


def test_a_read_sent_just_after_a_withhold_is_ended(redis_url):
    """The worker pauses before a hand back as its consumer, which checked it could take messages,
    sends its next read: that read stayed blocked its whole poll, taking the next message pushed."""
    prefetch = Prefetch(QueueReads())
    prefetch.bind(_Consumer(8))
    assert _read_sent_next_is_answered(prefetch.reads, redis_url, prefetch.withhold, "queue-held")


def test_a_withhold_while_paused_already_looks_once(redis_url):
    """Paused since an earlier hand back, the consumer has seen the pause (or that one's look goes
    on): each withhold looked on for 1 s, a CLIENT LIST every 10 ms, while a worker handed back
    through its waiting requests."""
    prefetch = Prefetch(QueueReads())
    prefetch.bind(_Consumer(8))
    assert prefetch.pause(True) and not prefetch.pause(True)  # (the earlier hand back's: 8 -> 1)
    prefetch.withhold(redis.Redis.from_url(redis_url))
    assert not _looking(prefetch.reads)


def test_told_again_while_it_looks_it_looks_on_one_thread(redis_url):
    """A worker that hands back again (or stops) while the read is looked for: one thread looks."""
    reads = QueueReads()

    def told_thrice(r: redis.Redis) -> None:
        for _ in range(3):
            reads.end_now_or_next(r)
        assert [thread.name for thread in threading.enumerate()].count(f"end-{reads.name}") == 1

    assert _read_sent_next_is_answered(reads, redis_url, told_thrice, "queue-thrice")


def test_a_read_blocked_at_the_stop_is_ended_at_once(redis_url):
    reads, r = QueueReads(), redis.Redis.from_url(redis_url)
    consumer = redis.Redis.from_url(redis_url, client_name=reads.name)
    answered = threading.Event()
    threading.Thread(target=lambda: (consumer.brpop(["queue-blocked"], timeout=0), answered.set()), daemon=True).start()
    blocked = lambda: any(c.get("name") == reads.name and "b" in c["flags"] for c in r.client_list())  # noqa: E731
    try:
        assert wait_until(blocked, 30)
        reads.end_now_or_next(r)
        assert answered.wait(30)
    finally:
        r.lpush("queue-blocked", b"x")


def test_a_look_lists_only_the_workers_own_connections(redis_url):
    """Looking on for a read (the consumer saw the pause: none comes), every AGAIN_S for READ_S, each
    look was a whole CLIENT LIST, a line per client in Redis: ~16 ms of Redis's time a look at 150
    clients, ~40 ms at 500-1,000 (and 0.1-0.3 s of the worker's CPU), at each pause and stop of every
    worker. Now the first look lists them all, the rest this worker's connections by id."""
    reads, r = QueueReads(), redis.Redis.from_url(redis_url)
    others = [redis.Redis.from_url(redis_url, client_name=f"another-{n}") for n in range(300)]
    mine = [redis.Redis.from_url(redis_url, client_name=reads.name) for _ in range(2)]  # (consumer, producer)
    try:
        for client in others + mine:
            client.ping()
        sent = lambda: r.info("stats")["total_net_output_bytes"]  # noqa: E731 (Redis's replies, in bytes)
        before = sent()
        r.client_list(_type="normal")
        whole_list = sent() - before
        before = sent()
        reads.end_now_or_next(r)
        assert wait_until(lambda: not _looking(reads), 30)
        assert sent() - before < 3 * whole_list  # (was: a whole list per look, ~50-90 of them)
    finally:
        for client in others + mine:
            client.close()
