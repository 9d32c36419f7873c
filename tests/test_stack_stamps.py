"""``stack_stamps``: up's judgement of which workers are frozen, by one read of their stamps
(``stale``), and how late Redis ran each round trip by its own clock (``StampReader``)."""

from __future__ import annotations

import copy
import os
import socket
import types

import pytest
import redis

import dayzero.stack_stamps
from dayzero.serving.liveness import STAMP_EVERY_S, Seen, process_id
from dayzero.stack_child import Child
from dayzero.stack_stamps import REDATED_AFTER_S, StampRead, StampReader, stale

BOUND_S = 30.0  # DAYZERO_FROZEN_WORKER_S


def _running(name: str, started: float, ready_at: float | None) -> Child:
    """A running prefill worker (its process this one: only its pid and ``poll`` are read)."""
    proc = types.SimpleNamespace(pid=os.getpid(), poll=lambda: None)
    return Child(name, "prefill", proc=proc, started=started, ready_at=ready_at)


def test_stale_asked_twice_gives_one_answer_and_changes_no_child():
    """A judgement only: it wrote ``Child.stamped`` (the last stamp read, which a restarted Redis loses),
    so the same question asked twice could be answered from what the first asking had written. A ready
    worker whose stamp is 40 s old by Redis's clock (read at monotonic 1000 s, Redis's time 5000 s, the
    stamp at 4960 s: 960 s monotonic), spawned at 900 s, and a starting one spawned at 990 s (the stamp
    is from before its spawn: another process's under its pid): the first is frozen, the second not,
    and both stay as they were."""
    process = process_id(os.getpid(), socket.gethostname())
    read = StampRead({"prefill": Seen(5000.0, {process: 4960.0}, {process: 4950.0})}, 999.9, 1000.0, False)
    hung, starting = _running("prefill0", 900.0, 950.0), _running("prefill1", 990.0, None)
    before = [copy.copy(hung), copy.copy(starting)]
    answers = [stale(read, [hung, starting], BOUND_S, 0.0) for _ in range(2)]
    assert answers == [[hung], [hung]]
    assert [hung, starting] == before, "stale() wrote to a Child"


def test_a_redis_0_6_s_away_is_judged_by_its_clock_and_a_frozen_one_still_counts_late():
    """Round trips to a remote Redis (its clock 7 s ahead of this host's; late_by(its TIME as it ran, this
    host's time at the send, the round trip's length)): 0.6 s each, 0.3 s each way. The first counts
    whole (nothing dated yet); the second dates the clocks (within 0.5 s of the quickest before it: an
    absolute 0.5 s never dated them, each counted 0.6 s, a read and its write 1.2 s: late, every pass)
    and ran 0.3 s after its send, the way there: 0 s late; one Redis held 1.5 s ran 1.8 s after, counts
    1.5 s, and dates nothing. A first round trip held 1.8 s by a frozen Redis counts whole: with nothing
    quicker before it, it dates nothing."""
    far = StampReader(redis.Redis(port=1))  # (no command is sent)
    sent = 1000.0
    assert far._late_by(sent + 7.3, sent, 0.6) == pytest.approx(0.6)
    assert far._late_by(sent + 7.3, sent, 0.6) == pytest.approx(0.0)
    assert far._late_by(sent + 8.8, sent, 2.1) == pytest.approx(1.5)
    assert far._late_by(sent + 7.3, sent, 0.6) == pytest.approx(0.0)
    frozen_at_first = StampReader(redis.Redis(port=1))
    assert frozen_at_first._late_by(sent + 7.0 + 1.7, sent, 1.8) == pytest.approx(1.8)


def test_a_redis_that_moved_far_away_is_dated_again(monkeypatch):
    """Dated over a 1 ms path, then the path is 0.6 s (a sentinel failover to a far replica, a VPN's
    other route) and Redis's clock 0.5 s ahead of the old one's: the offset is dropped (a step). The
    quickest round trip ever (1 ms) was kept for good: no 0.6 s one was within 0.5 s of it, none dated
    the clocks again, each read and its write counted whole (1.2 s, late) every pass, for ever (10 min
    here): the frozen check silently off. The quickest ages like the dating round trip (``REDATED_AFTER_S``):
    within a minute a read and its write are judged by Redis's clock again (0 s late past the way there)."""
    clock = [1000.0]  # this host's time.monotonic()
    monkeypatch.setattr(dayzero.stack_stamps, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    moved, sent = StampReader(redis.Redis(port=1)), 5000.0  # (no command is sent)
    assert moved._late_by(sent + 7.0005, sent, 0.001) == pytest.approx(0.0)
    passes = []
    for _ in range(10):
        clock[0] += REDATED_AFTER_S
        passes.append(sum(moved._late_by(sent + 7.5 + 0.3, sent, 0.6) for _ in range(2)))  # (a read, its write)
    assert passes[0] == pytest.approx(1.2)  # (the step; the 1 ms quickest still the minute before's)
    assert passes[1:] == pytest.approx([0.0] * 9)


def test_a_round_trip_held_as_the_quickest_ages_dates_nothing(monkeypatch):
    """A Redis dated over a 1 ms path that, a minute on (the quickest's age), holds two round trips
    1.9 s each (frozen; under the client's 2 s timeout): the 1 ms one still counts for the minute after,
    so neither dates the clocks and each counts 1.9 s (a quickest forgotten at its age took the first for
    the quickest and let the second date them, counted 0.95 s: a read held 1.9 s by a frozen Redis not
    late)."""
    clock = [1000.0]
    monkeypatch.setattr(dayzero.stack_stamps, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    near, sent = StampReader(redis.Redis(port=1)), 5000.0  # (no command is sent)
    assert near._late_by(sent + 7.0005, sent, 0.001) == pytest.approx(0.0)
    clock[0] += REDATED_AFTER_S
    late_s = [near._late_by(sent + 7.0 + 1.9, sent, took_s) for took_s in (1.9, 1.95)]
    assert late_s == pytest.approx([1.9, 1.9], abs=1e-3)  # (less the way there: 0.5 ms)


def test_a_healthy_redis_1_1_s_away_is_not_late_and_a_held_one_is():
    """A remote Redis 1.1 s away (0.55 s each way), healthy: once dated each round trip ran 0.55 s after
    its send by Redis's clock, the way there. Counted, a read and its write were 1.1 s late, over
    ``STAMP_EVERY_S``, every pass: the frozen check silently off (as at 0.6 s before the quickest dated
    the clocks). Past the way there they count 0 s; a read and its write Redis held 0.8 s each (1.9 s round
    trips, under the client's 2 s timeout) count 1.6 s: late."""
    far, sent = StampReader(redis.Redis(port=1)), 5000.0  # (no command is sent)
    assert far._late_by(sent + 7.55, sent, 1.1) == pytest.approx(1.1)  # (nothing dated yet: whole)
    passes = [sum(far._late_by(sent + 7.55, sent, 1.1) for _ in range(2)) for _ in range(3)]
    assert passes == pytest.approx([0.0] * 3)
    assert sum(far._late_by(sent + 7.55 + 0.8, sent, 1.9) for _ in range(2)) == pytest.approx(1.6)


def test_a_first_round_trip_held_takes_no_more_than_half_a_later_hold():
    """Redis 1 ms away; up's first round trip held 0.45 s (a frozen Redis, or up's thread between its
    send's time and the send, spawning its children), then a read a frozen Redis held 1.4 s, its write not
    held. Dated by the first, the offset took half its hold (0.225 s) and half of it as the quickest, the way
    there, took the other half: the read counted 1.4 - 0.45 = 0.95 s, with its write under ``STAMP_EVERY_S``,
    not late (by the offset alone, 1.175 s: late). A round trip within ``DATES_CLOCKS_S`` of the quickest
    dates them: the lateness is off by its hold, so that is 0.25 s, as the offset alone was: the first
    (0.45 s) dates nothing, the read counts whole, the write (1 ms) dates them and counts 0 s."""
    held, sent = StampReader(redis.Redis(port=1)), 5000.0  # (no command is sent; Redis's clock 7 s ahead)
    first_s = held._late_by(sent + 7.0 + 0.4505, sent, 0.451)
    read_s, write_s = held._late_by(sent + 7.0 + 1.4005, sent, 1.401), held._late_by(sent + 7.0005, sent, 0.001)
    assert (first_s, read_s, write_s) == pytest.approx((0.451, 1.401, 0.0))  # (nothing dated by the read: whole)
    assert read_s + write_s > STAMP_EVERY_S
