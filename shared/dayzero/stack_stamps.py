"""``dayzero up``'s read of its workers' liveness stamps (dayzero.serving.liveness), once per
``supervise()`` pass: every stage's stamps and Redis's time in one round trip (``seen_stages``),
which both say which starting workers are ready and which running ones are frozen. (The two
read them apart, the frozen check once per stage: four round trips and a write a pass.) Whether
Redis answered late is judged by its own clock (``StampReader``), not by how long up took.
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import redis
from redis.commands.core import Script

from .service_commands import SERVICES
from .serving.keys import key
from .serving.liveness import STAMP_EVERY_S, Seen, process_id, seen_stages
from .serving.redis_clock import NOW
from .stack_child import Child

WRITE_CHECK_TTL_S = 10  # up's own write beside its read of the stamps (key up:{process}) lapses after


def process_of(child: Child) -> str:
    """``child``'s running process as its stamps name it (up's children run on this host)."""
    return process_id(child.proc.pid, socket.gethostname())


class StampRead(NamedTuple):
    """One read of the stamps: ``stages`` ({} when Redis could not be read), ``began`` and ``at`` (when
    it was sent and answered, time.monotonic()), ``late``: unreadable, run by Redis (its write too) over
    ``STAMP_EVERY_S`` after its send by Redis's clock, the network's way there left out (a frozen Redis
    continued, writes held), or its write refused (maxmemory, a replica): no worker could stamp meanwhile,
    for the stamps are writes too. ``last``: the last stamp read of each watched child's process
    (time.monotonic()), this read's or, where Redis holds none (a new Redis lost it), an earlier one's
    (``StampReader``)."""

    stages: dict[str, Seen]
    began: float
    at: float
    late: bool
    last: Mapping[str, float] = MappingProxyType({})

    def stamped(self, child: Child, family: str = "alive") -> float | None:
        """When ``child``'s process last stamped (``family`` "ready": since when it is ready), on this
        host's monotonic clock (how old by Redis's clock: as old on this one); None if it has not."""
        found = self.stages.get(child.service)
        at = None if found is None else getattr(found, family).get(process_of(child))
        return None if at is None else self.at - found.now + at

    def ready_seen(self, child: Child) -> float | None:
        """``at`` if ``child`` stamped ready since its spawn, else None (a ready stamp from before it is
        another process's: a pid used again)."""
        since = self.stamped(child, "ready")
        return self.at if since is not None and since >= child.started else None


def stale(read: StampRead, children: list[Child], bound_s: float, unread_at: float) -> list[Child]:
    """The running workers of ``children`` whose last stamp by ``read`` is older than ``bound_s``, none
    older than ``unread_at`` (when Redis last could not be read or written: no worker could stamp). One
    not stamped yet (starting), or last by a process of its pid before its spawn (a pid used again), is not.
    A ready one's stamp that Redis lost (restarted: it holds none) is the last one read (``StampRead.last``):
    a running worker stamps again at once, a hung one was taken for one starting, never found frozen.
    A judgement only: the same arguments give the same answer, and nothing is written."""
    found = []
    for child in children:
        if child.service in read.stages and child.proc is not None and child.proc.poll() is None:
            stamped = read.stamped(child)  # (None: not stamped yet)
            if stamped is None and child.ready_at is not None:
                stamped = read.last.get(process_of(child))
            aged_s = -1.0 if stamped is None or stamped < child.started else read.at - max(stamped, unread_at)
            if aged_s > bound_s:
                found.append(child)
    return found


# up's write check (KEYS: its key; ARGV: the seconds it lapses after) -> Redis's time as it ran
WRITE_CHECK = NOW + "redis.call('SET', KEYS[1], now, 'EX', ARGV[1])\nreturn now\n"
# a round trip within this of the quickest before it (the network's share) may date Redis's clock against
# this host's: off by half of it at most, by half this on a path as long both ways. A lateness (less the way
# there, half the quickest) as much, or all this where the held one that dates them is the quickest (the
# first): half its hold in the offset, half in the way. (0.5 s: a read held 1.4 s counted 0.95 s, not late.)
DATES_CLOCKS_S = 0.25
CLOCK_RESOLUTION_S = 1e-3  # beside the offset's error (TIME's microseconds, time.time()'s, float sums: far less)
REDATED_AFTER_S = 60.0  # the quickest round trip of about this long dates them (a clock that drifts or steps)


@dataclass(slots=True)
class StampReader:
    """Reads every stage's stamps in one round trip, then (``write_check``: for the frozen check) makes a
    write of up's own, which a Redis refusing the workers' stamps refuses too, and keeps the last stamp
    read of each of up's workers (``StampRead.last``). Whether Redis ran a round trip late (frozen,
    holding writes) is judged by Redis's own clock (``_late_by``): how long after its send Redis ran it
    (its TIME less this host's time at the send, less ``offset_s``), the read's and the write's added.
    up's own thread held after Redis answered (a starved host: reads of 1.0-3.9 s, each taken for a
    frozen Redis, deferred the frozen check for good) is not Redis's; held between taking the send's time
    and sending, it is counted as Redis's (a frozen worker found a pass later). ``same_clock`` (up's own
    Redis, a child on this host): Redis's TIME is this host's time.time(), its offset 0 for good; a remote
    one's is dated by a round trip within ``DATES_CLOCKS_S`` of the quickest (``_date``)."""

    client: redis.Redis
    same_clock: bool = False
    offset_s: float | None = None  # Redis's clock less this host's (None: no quick round trip yet; 0: same_clock)
    _dated_by: tuple[float, float] = (math.inf, 0.0)  # the round trip that dated them: (its length, when)
    # the quickest round trips: this window's (``REDATED_AFTER_S`` long), the one before's, when this one began
    _quickest: tuple[float, float, float] = (math.inf, math.inf, 0.0)
    _last: dict[str, float] = field(default_factory=dict)  # watched process -> its last stamp read (new each read)
    _write_check: Script = field(init=False)

    def __post_init__(self) -> None:
        self._write_check = self.client.register_script(WRITE_CHECK)
        self.offset_s = 0.0 if self.same_clock else self.offset_s

    def read(self, write_check: bool, children: list[Child]) -> StampRead:
        """The stamps, ``last`` kept for ``children``'s processes."""
        began, sent, stages, refused = time.monotonic(), time.time(), {}, False
        with contextlib.suppress(redis.RedisError):
            stages = seen_stages(self.client, SERVICES[1:], forget=False)  # (the gateway's reads forget)
        at = time.monotonic()  # (the stamps' ages date from here: the write's round trip left out)
        late_s = [self._late_by(next(iter(stages.values())).now, sent, at - began)] if stages else []
        try:
            if write_check and stages:
                began_write, sent = time.monotonic(), time.time()
                ran = float(self._write_check(keys=[key("up", process_id())], args=[WRITE_CHECK_TTL_S]))
                late_s.append(self._late_by(ran, sent, time.monotonic() - began_write))
        except redis.RedisError:
            refused = True
        late = not stages or refused or sum(late_s) > STAMP_EVERY_S
        return self._remembered(StampRead(stages, began, at, late), children)

    def _remembered(self, read: StampRead, children: list[Child]) -> StampRead:
        """``read`` with ``last``: for each of ``children``'s processes, its stamp in ``read``, or where
        ``read`` holds none the one kept; the processes of no child (exited, restarted) forgotten."""
        last = {}
        for child in children:
            if child.proc is not None:
                process, stamped = process_of(child), read.stamped(child)
                last[process] = self._last.get(process) if stamped is None else stamped
        self._last = {process: at for process, at in last.items() if at is not None}
        return read._replace(last=self._last)

    def _late_by(self, ran: float, sent: float, took_s: float) -> float:
        """How long after its send (``sent``, this host's time.time()) Redis ran a round trip (``ran``, its
        TIME) that took ``took_s`` to answer, by Redis's clock, past the network's way there (a remote
        Redis's: half the quickest round trip): its TIME less ``sent``, the clocks' offset and that way,
        within the round trip; the whole round trip while the offset is unknown. (The way there counted, a
        healthy Redis 1.1 s away counted 0.55 s a trip, 1.1 s a read and its write: every read late.)"""
        if not self.same_clock:  # (up's starved thread dated nothing: every read counted late, no worker found frozen)
            self._date(ran, sent, took_s)
        way_s = 0.0 if self.same_clock else min(self._quickest[:2]) / 2  # (finite once a round trip was made)
        return took_s if self.offset_s is None else min(took_s, max(0.0, ran - sent - self.offset_s - way_s))

    def _date(self, ran: float, sent: float, took_s: float) -> None:
        """A remote Redis's ``offset_s`` by a round trip (as ``_late_by``'s). One within ``DATES_CLOCKS_S`` of
        the quickest before it (the first: under it), and quicker than the one that dated them (or that one
        older than ``REDATED_AFTER_S``), dates them again, Redis's reading taken at its middle; one a frozen
        Redis held dates nothing. (Only one under 0.5 s dated them: a Redis 0.6 s away never was, each read
        and write counted whole, 1.2 s, late, and no frozen worker was ever found.) The quickest is of the
        last one or two ``REDATED_AFTER_S`` (kept for good, a Redis whose path went from 1 ms to 0.6 s and
        whose clock then stepped was never dated again: every read late, the frozen check off for good; one
        held by a frozen Redis as a window begins still dates nothing: the window before's counts). One that
        Redis ran before its send or after its answer by the dated clocks (past their error, half the dating
        round trip) says a clock stepped (NTP, on either host): the offset is dropped (stepped ahead, a read
        answered late counted 0 s and the stamps aged by a frozen Redis found every worker frozen; stepped
        back, every read counted late till a re-dating)."""
        slack_s = self._dated_by[0] / 2 + CLOCK_RESOLUTION_S  # (the offset's error)
        if self.offset_s is not None and not -slack_s <= ran - sent - self.offset_s <= took_s + slack_s:
            self.offset_s, self._dated_by = None, (math.inf, 0.0)
        now, (dated_by_s, dated_at) = time.monotonic(), self._dated_by
        recent_s = dated_by_s if now - dated_at < REDATED_AFTER_S else math.inf
        this_s, before_s, begun = self._quickest
        if now - begun >= REDATED_AFTER_S:  # (a new window: the path may have changed, a failover to a far replica)
            this_s, before_s, begun = math.inf, this_s if now - begun < 2 * REDATED_AFTER_S else math.inf, now
        quickest_s = min(this_s, before_s)
        if took_s <= min(recent_s, (0.0 if quickest_s == math.inf else quickest_s) + DATES_CLOCKS_S):
            self.offset_s, self._dated_by = ran - (sent + took_s / 2), (took_s, now)
        self._quickest = (min(this_s, took_s), before_s, begun)
