"""A worker process's liveness, apart from its work.

The loops' heartbeats (registry.py's presence, lease.py's leases) come from the work itself: a
long step stops them (a million-token prefill forward may rightly run for many minutes). A
``Pulse`` thread stamps "this process runs" instead, every ``STAMP_EVERY_S`` (a stamp Redis failed:
again after ``STAMP_RETRY_S``, later once it has failed ``QUICK_RETRIES_S``: ``retry_after``), from
before the worker loads its weights: SIGSTOP or a process that no longer runs stops it, a forward
however long does not. A step past its bound, or a loop that has not moved between steps for the
group timeout (``lease.Heartbeat.stuck``: its leases lapse), stops it too, on purpose: that worker
is as good as frozen (its process runs, its loop does not); and so does a stopped child (a
tensor-parallel worker's other ranks are its rank 0's children): the group's next collective waits
on it until the group's timeout.

A process serves its stage once it is also ready (loaded, warmed up, its loop running): a
loading worker cannot take a request, and one that crash-loops (dies while loading or warming up,
again and again under ``dayzero up`` or a restart policy) stamps at each start but never serves.

Keys (prefix ``dz:``): alive:{stage}, a hash of process ("{host}:{pid}") -> the time of its last
stamp; ready:{stage}, process -> since when it is ready (written with each stamp: a restarted
process under the same id, a container's pid 1, is not ready until it says so); unserved:{stage},
since when the stage has had no serving process (set by the gateway; kept while only processes
ready for less than ``PROVEN_S`` serve it, the time they served left out of the count: no_worker_count.py);
restart:{stage}, since when that count runs instead (the readiness of the first process ready after it);
counted:{stage}, when a gateway last counted (the Redis time of its read of the stamps); unserved and
restart begun again after Redis was lost or refused writes (``count_again``: the stamps aged meanwhile),
for a stage some process served at its last count or since (one that none served keeps its count);
stamp_now, a stream whose new entry wakes the stamps backing off after a refusal (``wake_stampers``).
One clock: Redis's (TIME, redis_clock.py). The stamps are written with it (``STAMP``) and read with
it, in the read's own round trip (``seen``): a worker host whose clock is behind the gateway's by
``FRESH_S`` looked dead to ``/ready``, one ahead kept a dead worker serving as long; the hosts'
clocks need not agree. Each stamp's answer also measures this process's offset to Redis's clock
(``redis_clock.now``: the time limit's).
Readers: ``dayzero up`` restarts a worker whose stamp is older than DAYZERO_FROZEN_WORKER_S
(stack.py), a compose healthcheck fails one so (``dayzero alive``); the gateway ends the requests
waiting at a stage that has had no serving process for DAYZERO_NO_WORKER_TIMEOUT_S (reaper.py), and
``/ready`` counts each stage's serving processes (gateway/readiness.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import redis

from ..redis_clients import sync_client
from .keys import key
from .redis_clock import NOW, hashes_at, measured
from .redis_clock import now as redis_now

log = logging.getLogger("dayzero.liveness")
STAMP_EVERY_S = 1.0
# A stamp Redis failed (refused, down) goes again after this: every stamp aged through the outage, and
# /ready said "no live worker" (its workers serving) until their next ones, 0.4-0.9 s after it.
STAMP_RETRY_S = 0.1
QUICK_RETRIES_S = 5.0  # so for this long (an outage of seconds: a failover, a restart); then ``retry_after``
FRESH_S = 3.0  # a stage whose newest stamp is older has no live process
FORGET_S = 600.0  # stamps this old are dropped (a restarted process stamps under a new pid)

# A stamp at Redis's time now (KEYS: alive, ready, stamp_now; ARGV: the process, since when it is ready:
# "" loading, "now", or a time of an earlier stamp; "again" after failed ones, else "") -> that time.
# Again: Redis takes writes again, said to the processes backing off (``wake_stampers``).
STAMP = (
    NOW
    + """
redis.call('HSET', KEYS[1], ARGV[1], now)
if ARGV[2] == '' then
    redis.call('HDEL', KEYS[2], ARGV[1])
else
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] == 'now' and now or ARGV[2])
end
if ARGV[3] == 'again' then redis.call('XADD', KEYS[3], 'MAXLEN', '1', '*', 'at', now) end  -- (wake_stampers)
return now
"""
)


def process_id(pid: int | None = None, host: str | None = None) -> str:
    """A worker process as its stamps name it (``up`` names its children the same way)."""
    return f"{host or socket.gethostname()}:{pid or os.getpid()}"


def stopped_child(pid: int | None = None) -> bool:
    """A child of process ``pid`` (this one) is stopped (SIGSTOP, or held by a tracer); False where
    /proc lists no children (not Linux)."""
    for children in Path(f"/proc/{pid or os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # a thread or child that ended meanwhile
            for child in children.read_text().split():
                state = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0]
                if state in ("T", "t"):
                    return True
    return False


def retry_after(refused_s: float) -> float:
    """How long a stamp that Redis has refused since ``refused_s`` ago (every try since) waits before
    it goes again: ``STAMP_RETRY_S`` for ``QUICK_RETRIES_S``, then a stamp period, jittered by half
    either way. Every worker retrying every 0.1 s while Redis refused was ten refused scripts a second
    each (1,000 workers: ~10,000 a second, bench/refused_stamps.py); after the quick ones they cost
    Redis what the workers' stamps cost it when it takes them, spread apart. (A Redis down costs
    nothing to try: every ``STAMP_RETRY_S``; one that answers late, loaded, is backed off from.)"""
    if refused_s < QUICK_RETRIES_S:
        return STAMP_RETRY_S
    return STAMP_EVERY_S * random.uniform(0.5, 1.5)


def wake_stampers(client: redis.Redis) -> None:
    """Tell the processes whose stamps back off after refusals (``retry_after``) to stamp now: Redis
    takes writes again (the first of them whose stamp it takes says so too, in its ``STAMP``)."""
    client.xadd(key("stamp_now"), {"at": ""}, maxlen=1, approximate=False)


def await_wake(client: redis.Redis, seconds: float, stop: threading.Event, tried_at: float) -> None:
    """Wait ``seconds``, or until ``wake_stampers`` since ``tried_at`` (Redis's time as this process
    knows it: when the refused stamp was sent; a wake before the wait began counts: from the wait's
    start it was missed), or ``stop``: the workers backing off stamp again within a round trip of it,
    not up to a period and a half later."""
    until, since = time.monotonic() + seconds, f"{int(tried_at * 1000) - 1}-0"  # (an entry from then on)
    while (left_s := until - time.monotonic()) > 0 and not stop.is_set():
        try:  # (1.5 s at most at a time: the client's socket times out at 2 s)
            if client.xread({key("stamp_now"): since}, block=max(1, int(1000 * min(left_s, 1.5)))):
                return
        except redis.RedisError:  # (down: looked at again soon, which costs it nothing)
            stop.wait(min(left_s, STAMP_RETRY_S))


def connect(url: str) -> redis.Redis:
    """A client that gives up quickly: a stamp or a check never waits long on a hung Redis."""
    return sync_client(url, socket_timeout=2, socket_connect_timeout=2)


class Pulse:
    """Stamps this process alive in ``stage``'s hash until ``stop``, unless ``stuck()`` says its
    loop is stuck (``watch`` sets it once the stage is built) or a child of it (a rank) is stopped."""

    def __init__(self, client: redis.Redis, stage: str) -> None:
        self.r, self.stage, self.process = client, stage, process_id()
        self._script = client.register_script(STAMP)
        self._ready, self._ready_at = False, ""  # ready, and since when by Redis's clock ("": not stamped yet)
        self._failed = False  # its last stamp failed
        self._stamping = threading.Lock()  # (``ready`` stamps from the worker's thread, ``_run`` from its own)
        self._stuck: Callable[[], bool] = lambda: False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> Pulse:
        self._thread.start()
        return self

    def watch(self, stuck: Callable[[], bool]) -> None:
        self._stuck = stuck

    def ready(self) -> None:
        """Loaded and taking work: it serves its stage from now on, stamped at once (its requests are
        taken before the next stamp: ended as unserved meanwhile, after a long load)."""
        self._ready = True
        with contextlib.suppress(redis.RedisError):
            self._stamp()

    def _run(self) -> None:
        said, refused_at = None, None  # (since when Redis has refused every stamp: retry_after)
        while True:
            why = "the loop is stuck" if self._stuck() else "a rank is stopped" if stopped_child() else None
            if why is not None and why != said:
                log.error("%s: no more liveness stamps (dayzero up restarts the worker)", why)
            said, again_s, tried_at = why, STAMP_EVERY_S, redis_now()  # (a wake from then on ends the wait)
            if why is None:  # (up counts no staleness while it cannot read)
                try:
                    self._stamp()
                    refused_at = None
                except (redis.ResponseError, redis.TimeoutError):  # refused, or slow to answer: back off
                    refused_at = time.monotonic() if refused_at is None else refused_at
                    again_s = retry_after(time.monotonic() - refused_at)
                except redis.RedisError:  # down (its connection refused): a try costs it nothing
                    again_s = STAMP_RETRY_S
            backing_off = again_s > STAMP_RETRY_S and refused_at is not None
            if backing_off:
                await_wake(self.r, again_s, self._stop, tried_at)
            if self._stop.wait(0 if backing_off else again_s):
                return

    def _stamp(self) -> None:
        """Alive now, and ready since when (the first stamp since ``ready``) or not yet, in one script
        (a Redis restarted meanwhile has both again), at Redis's time."""
        with self._stamping:
            since = (self._ready_at or "now") if self._ready else ""
            keys = [key("alive", self.stage), key("ready", self.stage), key("stamp_now")]
            sent = time.time()
            try:
                now = self._script(keys=keys, args=[self.process, since, "again" if self._failed else ""])
            except redis.RedisError:
                self._failed = True
                raise
            self._failed = False
            measured(float(now), sent, time.time())  # (this process's offset to Redis's clock: redis_clock.now)
            if since == "now":
                self._ready_at = now.decode()

    def stop(self) -> None:
        """No more stamps, and out of the hashes: a stopping worker serves no new request."""
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            self.r.hdel(key("alive", self.stage), self.process)
            self.r.hdel(key("ready", self.stage), self.process)


class Seen(NamedTuple):
    """A stage's stamps as one read found them, with Redis's time then (their clock)."""

    now: float
    alive: dict[str, float]  # process -> its last stamp
    ready: dict[str, float]  # process (of ``alive``) -> since when it is ready (fresh or not)


def seen(client: redis.Redis, stage: str) -> Seen:
    """``stage``'s stamps and Redis's time, in one round trip (``seen_stages``)."""
    return seen_stages(client, (stage,))[stage]


def seen_stages(client: redis.Redis, stages: tuple[str, ...], forget: bool = True) -> dict[str, Seen]:
    """Each of ``stages``' stamps and Redis's time, in one round trip; stamps older than ``FORGET_S``
    are left out and (``forget``) leave the hash, but a ready process's (the time it served is left out
    of its stage's no-worker count: no_worker_count.unserved_stages forgets them once no count runs), and
    ready entries of processes without a stamp theirs. (``forget`` False: a read that writes nothing,
    which Redis holding writes does not hold: up's, stack_stamps.py.)"""
    now, hashes = hashes_at(client, *(key(family, stage) for stage in stages for family in ("alive", "ready")))
    found = {}
    for stage, alive, ready in zip(stages, hashes[::2], hashes[1::2], strict=True):
        ready_since = {p.decode(): float(t) for p, t in ready.items()}
        stamped = {p: float(t) for p, t in ((p.decode(), t) for p, t in alive.items())}
        stamped = {p: t for p, t in stamped.items() if now - t <= FORGET_S or p in ready_since}
        gone = {p.decode() for p in alive} - stamped.keys(), ready_since.keys() - stamped.keys()
        for family, processes in zip(("alive", "ready"), gone, strict=True):
            if processes and forget:
                client.hdel(key(family, stage), *processes)
        found[stage] = Seen(now, stamped, {p: since for p, since in ready_since.items() if p in stamped})
    return found


def kept_old(found: Seen) -> list[str]:
    """The ready processes whose stamps ``seen`` kept past ``FORGET_S`` (for the no-worker count)."""
    return [p for p in found.ready if found.now - found.alive[p] > FORGET_S]


def stamps(client: redis.Redis, stage: str) -> dict[str, float]:
    """Each process's last stamp in ``stage`` (Redis's time)."""
    return seen(client, stage).alive


def stamped_ago(client: redis.Redis, stage: str, host: str | None = None) -> float | None:
    """How long ago the newest of ``stage``'s processes on ``host`` (this one: a container's own
    worker, whichever pid it had before a restart) stamped; None if none of them has."""
    here, found = host or socket.gethostname(), seen(client, stage)
    newest = max((t for p, t in found.alive.items() if p.rpartition(":")[0] == here), default=None)
    return None if newest is None else found.now - newest


def serving(client: redis.Redis, stage: str) -> dict[str, float]:
    """The processes that serve ``stage`` now (a fresh stamp, and ready) -> since when each is ready."""
    found = seen(client, stage)
    return {p: since for p, since in found.ready.items() if found.now - found.alive[p] <= FRESH_S}
