"""Decode's room between busy workers: a request is handed back only to a peer that reads the queue."""

from __future__ import annotations

import contextlib
import time

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, admitted_blocks, to_decode
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording
from .prefill_jobs import handed_off, needing

TIGHT = {"handoff": "redis", "kv_budget_mb": 1, "max_batch": 4, "lease_s": 30, "handoff_timeout_s": 600}


@contextlib.contextmanager
def two_decoders(demo_dir, redis_url, requests: tuple[str, ...], name: str):
    """``requests`` handed off (their jobs by id), and two decode loops (``name``0, 1) of tight pools, the
    only decode workers of this module's Redis: (store, jobs, a, b); the loops stop on the way out."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, **TIGHT)
    store, sent = handed_off(settings, requests)
    loops = []
    store.r.delete(key("workers", "decode"))  # (no other decode worker of this module's Redis)
    try:
        for i in range(2):
            runtime = Runtime.load(settings, f"{name}{i}@test", "decode", False)
            loops.append(DecodeLoop(runtime, Room(runtime, Prefetch(), to_decode(runtime, recording([], "decode")))))
        yield store, {job.request.request_id: job for job in sent}, *loops
    finally:
        for loop in loops:
            loop.stop.set()
            loop.r.close()


def test_a_decode_worker_paused_since_its_own_hand_back_is_no_peer_with_room(demo_dir, redis_url):
    """decode "b" handed "big" back (its pools cannot hold it; a peer had room then) and takes no
    message till they could: its snapshot still shows free blocks, room for "small". decode "a", full,
    with "small" waiting, handed it back to b all the same: b never read it, and a, once it had room,
    took it back itself and handed it back again (the bounce of two busy decode workers). Now a keeps
    it while b's snapshot says its intake is paused, and hands it back once b takes messages again."""
    with two_decoders(demo_dir, redis_url, ("pause-big", "pause-small"), "decode4") as (store, jobs, a, b):
        registry = Registry(store.r)
        a.r.ranks.reserve("elsewhere", a.r.pools.capacity_tokens())
        b.r.ranks.reserve("elsewhere", b.r.pools.capacity_tokens() - 1000)  # room for "small" only
        empty = {kind: [0, total] for kind, (_, total) in b.r.pools.usage().items()}
        registry.alive("decode", "decode42@test:peer", {"stage": "decode", "pools": empty, "gauges": {}})
        b.intake.submit(needing(jobs["pause-big"], 2000, time.time()))
        b._iteration()  # "big" waits, goes back to the queue for the peer; b pauses, its snapshot says so
        assert b.waiting == [] and b.room.owed is not None and store.owner("pause-big") == HANDOFF_OWNER
        registry.leave("decode", "decode42@test:peer")
        assert b.r.pools.fits(a._tokens(jobs["pause-small"])) and registry.snapshots_of([b.r.name])

        a.intake.submit(jobs["pause-small"])
        a._iteration()  # its beat's hand back: b's blocks hold it, but b takes no message
        assert [t.job.request.request_id for t in a.waiting] == ["pause-small"]
        assert store.owner("pause-small") == a.r.name

        b.r.ranks.release("elsewhere")
        b.room.consume(busy=False)  # its pools hold what it handed back: it takes messages again
        b.r.presence.beat(lambda: b.r.snapshot(1))
        a.waiting = a.room.hand_back(a.waiting, a._tokens, a.heartbeat)
        assert a.waiting == [] and store.owner("pause-small") == HANDOFF_OWNER  # back on the queue, for b


def test_a_peer_is_handed_nothing_its_arrivals_since_its_snapshot_may_have_taken_the_room_for(demo_dir, redis_url):
    """decode "b"'s snapshot shows room for "waiting" (decode "a" cannot hold it), but b admitted an
    arrival over the beat before it, and the arrivals it reads before what a hands it take its
    blocks first: a handed it back all the same (1 in ~60 hand-backs of bench/handback_decode.py),
    and it waited at b, first in line, till a peer had room. Now a counts what b admitted over its
    last beat (``admitted_tokens``) as gone from its free blocks, and keeps it; once b's beat shows
    no arrival, a hands it back."""
    with two_decoders(demo_dir, redis_url, ("arrival", "waiting"), "decode5") as (store, jobs, a, b):
        arrival, waiting = needing(jobs["arrival"], 600, time.time()), needing(jobs["waiting"], 1000, time.time())
        a.r.ranks.reserve("elsewhere", a.r.pools.capacity_tokens())
        b.r.ranks.reserve("elsewhere", b.r.pools.capacity_tokens() - 2000)
        b.intake.submit(arrival)
        b._iteration()  # it admits the arrival; its beat says so
        b.r.presence.beat(lambda: b.r.snapshot(1))
        assert list(b.active) == ["arrival"] and b.r.stats.gauges["admitted_tokens"] == b._tokens(arrival)
        assert b.r.pools.fits(a._tokens(waiting))  # its snapshot's free blocks hold "waiting"
        b.r.ranks.reserve("next", b._tokens(arrival))  # (as the next arrival would)
        assert not b.r.pools.fits(a._tokens(waiting))
        b.r.ranks.release("next")

        a.intake.submit(waiting)
        a._iteration()  # its beat's hand back: b's arrivals may take the room first
        assert [t.job.request.request_id for t in a.waiting] == ["waiting"] and store.owner("waiting") == a.r.name

        b._last_beat = 0.0
        b._iteration()  # a beat with no arrival over it
        b.r.presence.beat(lambda: b.r.snapshot(1))
        a.waiting = a.room.hand_back(a.waiting, a._tokens, a.heartbeat)
        assert a.waiting == [] and store.owner("waiting") == HANDOFF_OWNER  # back on the queue, for b


def test_a_peer_s_arrivals_over_its_beat_count_a_window_each(demo_dir, redis_url):
    """decode "b" admitted two arrivals over its last beat: each holds a window of its own (one of
    four), but a counted the blocks of their tokens together (``admitted_tokens``) as gone, one
    window, saw room for "waiting" left and handed it back, for b's next arrivals to take first. Now
    b publishes its arrivals' blocks, each request's own (``admitted_blocks``), and a keeps it."""
    with two_decoders(
        demo_dir, redis_url, ("pair-1", "pair-2", "pair-waiting"), ("decode60@test", "decode61@test")
    ) as (store, jobs, a, b):
        a.r.ranks.reserve("elsewhere", a.r.pools.capacity_tokens())
        for rid in ("pair-1", "pair-2"):
            b.intake.submit(needing(jobs[rid], 50, time.time()))
        b._iteration()  # it admits both; its beat says so
        b.r.presence.beat(lambda: b.r.snapshot(1))
        used, total = b.r.pools.usage()["window"]
        assert sorted(b.active) == ["pair-1", "pair-2"] and (used, total) == (2, 4)
        assert b.r.stats.gauges[admitted_blocks("window")] == 2

        a.intake.submit(needing(jobs["pair-waiting"], 50, time.time()))
        a._iteration()  # its beat's hand back: b's next two arrivals would take both windows left
        assert [t.job.request.request_id for t in a.waiting] == ["pair-waiting"]
        assert store.owner("pair-waiting") == a.r.name
