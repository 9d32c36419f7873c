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
from dataclasses import dataclass, field
from typing import NamedTuple

import redis
from redis.commands.core import Script

from .service_commands import SERVICES
from .serving.keys import key
from .serving.liveness import STAMP_EVERY_S, Seen, process_id, seen_stages
from .serving.redis_clock import NOW
from .stack_child import Child

WRITE_CHECK_TTL_S = 10  # up's own write beside its read of the stamps (key up:{process}) lapses after


class StampRead(NamedTuple):
    """One read of the stamps: ``stages`` ({} when Redis could not be read), ``began`` and ``at`` (when
    it was sent and answered, time.monotonic()), ``late``: unreadable, run by Redis (its write too)
    over ``STAMP_EVERY_S`` after its send by Redis's clock (a frozen Redis continued, writes held), or
    its write refused (maxmemory, a replica): no worker could stamp meanwhile, for the stamps are
    writes too."""

    stages: dict[str, Seen]
    began: float
    at: float
    late: bool

    def stamped(self, child: Child, family: str = "alive") -> float | None:
        """When ``child``'s process last stamped (``family`` "ready": since when it is ready), on this
        host's monotonic clock (how old by Redis's clock: as old on this one); None if it has not."""
        found = self.stages.get(child.service)
        at = None if found is None else getattr(found, family).get(process_id(child.proc.pid, socket.gethostname()))
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
    A ready one's stamp that Redis lost (restarted: it holds none) is the last one read (``Child.stamped``):
    a running worker stamps again at once, a hung one was taken for one starting, never found frozen."""
    found = []
    for child in children:
        if child.service in read.stages and child.proc is not None and child.proc.poll() is None:
            stamped = read.stamped(child)  # (None: not stamped yet)
            if stamped is None and child.ready_at is not None:
                stamped = child.stamped
            child.stamped = stamped
            aged_s = -1.0 if stamped is None or stamped < child.started else read.at - max(stamped, unread_at)
            if aged_s > bound_s:
                found.append(child)
    return found


# up's write check (KEYS: its key; ARGV: the seconds it lapses after) -> Redis's time as it ran
WRITE_CHECK = NOW + "redis.call('SET', KEYS[1], now, 'EX', ARGV[1])\nreturn now\n"
DATES_CLOCKS_S = 0.5  # a round trip this quick may date Redis's clock against this host's (off by half of it at most)
CLOCK_RESOLUTION_S = 1e-3  # beside the offset's error (TIME's microseconds, time.time()'s, float sums: far less)
REDATED_AFTER_S = 60.0  # the quickest round trip of about this long dates them (a clock that drifts or steps)


@dataclass(slots=True)
class StampReader:
    """Reads every stage's stamps in one round trip, then (``write_check``: for the frozen check) makes a
    write of up's own, which a Redis refusing the workers' stamps refuses too. Whether Redis ran a round
    trip late (frozen, holding writes) is judged by Redis's own clock: how long after its send Redis ran
    it (its TIME less this host's time at the send), less that difference in the quickest recent round
    trip (``offset_s``), the read's and the write's added. up's own thread held after Redis answered (a
    starved host: reads of 1.0-3.9 s, each taken for a frozen Redis, deferred the frozen check for good)
    is not Redis's; held between taking the send's time and sending, it is counted as Redis's (a frozen
    worker found a pass later). ``same_clock`` (up's own Redis, a child on this host): Redis's TIME is this
    host's time.time(), no offset to date; a remote one's is dated by a round trip of ``DATES_CLOCKS_S`` at
    most (a host starved of every such one judges whole round trips)."""

    client: redis.Redis
    same_clock: bool = False
    offset_s: float | None = None  # Redis's clock less this host's (None: no quick round trip yet; unused: same_clock)
    _dated_by: tuple[float, float] = (math.inf, 0.0)  # the round trip that dated them: (its length, when)
    _write_check: Script = field(init=False)

    def __post_init__(self) -> None:
        self._write_check = self.client.register_script(WRITE_CHECK)

    def read(self, write_check: bool) -> StampRead:
        began, sent, stages, refused = time.monotonic(), time.time(), {}, False
        with contextlib.suppress(redis.RedisError):
            stages = seen_stages(self.client, SERVICES[1:], forget=False)  # (the gateway's reads forget)
        at = time.monotonic()  # (the stamps' ages date from here: the write's round trip left out)
        ran_late_s = [self._ran_after(next(iter(stages.values())).now, sent, at - began)] if stages else []
        try:
            if write_check and stages:
                began_write, sent = time.monotonic(), time.time()
                ran = float(self._write_check(keys=[key("up", process_id())], args=[WRITE_CHECK_TTL_S]))
                ran_late_s.append(self._ran_after(ran, sent, time.monotonic() - began_write))
        except redis.RedisError:
            refused = True
        return StampRead(stages, began, at, not stages or refused or sum(ran_late_s) > STAMP_EVERY_S)

    def _ran_after(self, ran: float, sent: float, took_s: float) -> float:
        """How long after its send (``sent``, this host's time.time()) Redis ran a round trip (``ran``, its
        TIME) that took ``took_s`` to answer: the whole round trip until the clocks are dated. One quicker
        than ``DATES_CLOCKS_S`` and than the one that dated them (or that one older than
        ``REDATED_AFTER_S``) dates them again, Redis's reading taken at its middle. One that Redis ran
        before its send or after its answer by the dated clocks (past their error, half the dating round
        trip) says a clock stepped (NTP, on either host of a remote Redis): the offset is dropped and the
        whole round trip counts (stepped ahead, a read answered late counted 0 s and the stamps aged by a
        frozen Redis found every worker frozen; stepped back, every read counted late till a re-dating)."""
        if self.same_clock:  # (up's starved thread dated nothing: every read counted late, no worker found frozen)
            return min(took_s, max(0.0, ran - sent))
        slack_s = self._dated_by[0] / 2 + CLOCK_RESOLUTION_S  # (the offset's error)
        if self.offset_s is not None and not -slack_s <= ran - sent - self.offset_s <= took_s + slack_s:
            self.offset_s, self._dated_by = None, (math.inf, 0.0)
        dated_by_s, dated_at = self._dated_by
        recent_s = dated_by_s if time.monotonic() - dated_at < REDATED_AFTER_S else math.inf
        if took_s <= min(recent_s, DATES_CLOCKS_S):
            self.offset_s, self._dated_by = ran - (sent + took_s / 2), (took_s, time.monotonic())
        return took_s if self.offset_s is None else min(took_s, max(0.0, ran - sent - self.offset_s))
