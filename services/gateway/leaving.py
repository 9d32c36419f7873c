"""Clients leaving requests, and coming back for them: a request nobody reads any more is cancelled
(after the disconnect grace for a stream, whose client may resume it), each step tried again while
Redis is down, and a resume that reached this gateway within the grace keeps its request.

A leave unwatches its read; with nobody left reading, it waits out the grace and marks the request
cancelled. A step Redis fails (stopped, restarting, frozen past the commands' bound) is tried again,
the pause doubling up to ``RETRY_S[1]`` (cut short once Redis, unreached, answers a PING again),
until it goes through or the request's time limit has passed (it has ended by then): a cancel lost
there left the request generating to its end for a client that had gone, its exception never
retrieved. Once Redis failed a step, the cancel is left to
Redis, due ``DAYZERO_REFUSED_CANCEL_AFTER_S`` later, when another gateway runs on the Redis
(dayzero.serving.gateways): a resume there whose watch Redis refused too takes it back on its next
try (the retried cancel landed first, and cancelled it under its reader); alone, it goes at once.
A resume that reaches this gateway (its route, before any Redis) holds a pending cancel until its
stream starts reading, which supersedes the cancel: the resumed read's own leave decides again. Left
to Redis alone, a stall across the grace's end let the cancel overtake the resume's four commands (5
of ~600 resumes in the soak's Redis stops were cancelled under their client). Resumes on another
gateway are judged by Redis: the cancel is one step there (``Watching.cancel_unwatched``), taken
only while nobody reads the stream. A gateway that stops leaves the cancels still within their grace
to Redis (``Watching.cancel_later``): a rolling restart's clients resume on another gateway, or on
this one once it runs again (which cancels them no sooner than a grace after its start: app.py's
reaper).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from dayzero.serving import redis_clock as clock
from dayzero.serving.gateways import others_run
from dayzero.serving.watching import Watching

log = logging.getLogger("dayzero.gateway")
# The first and the longest pause between tries of a step Redis failed. A cancel of a leave Redis
# failed a step of goes to Redis due ``refused_cancel_after_s`` (7 s) after (``Watching.cancel_later``):
# a resume on another gateway whose watch Redis refused too is tried again within RETRY_S[1] and takes
# it back (cancelled at once, the retried cancel could land first: cancelled under its reader).
# Not a request answered in one body: nobody can resume it (it decoded 7 s on for a client gone); nor
# any while no other gateway runs on the Redis (dayzero.serving.gateways): a resume here holds or
# supersedes the cancel (``coming``, ``reading``): it decoded 7 s on for nobody.
RETRY_S = (0.2, 5.0)
# While Redis is unreached (a step's try timed out or its connection failed), one PING at a time asks
# whether it answers again, each bounded by PROBE_S (a connect during a partition waits for the SYN's
# retries, a command for TCP's backoff): once one answers, every step paused goes at once, not at the
# end of its pause (up to RETRY_S[1] and a try's bound after Redis was back: a two-way partition's
# lost streams decoded 4-7 s more for nobody: 146-384 of the demo's tokens, bench/hung_redis.py).
PROBE_S = 1.0
ARRIVAL_S = 30.0  # a resume not reading this long after it came (its response never began) holds no cancel
ARRIVAL_POLL_S = 0.05
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Leave:
    request_id: str
    deadline: float  # Redis's unix time (redis_clock.now): the request has ended by then (its time limit)
    grace_ends: float  # Redis's unix time: its cancel is due (at once: a client that cannot resume it)
    superseded: bool = False  # a client reads it again: that read's own leave decides
    refused: bool = False  # Redis failed one of its steps (its cancel is left to Redis, refused_cancel_after_s on)


class Leaving:
    def __init__(
        self, watching: Watching, gateway: str, grace_s: float, time_limit_s: float, refused_cancel_after_s: float
    ) -> None:
        """``gateway``: this gateway's id among those on the Redis (dayzero.serving.gateways)."""
        self.watching, self.gateway, self.grace_s, self.time_limit_s = watching, gateway, grace_s, time_limit_s
        self.refused_cancel_after_s = refused_cancel_after_s
        self._pending: dict[str, set[Leave]] = {}  # leaves that may still cancel, by request
        self._arrivals: dict[str, list[float]] = {}  # resumes on their way in (monotonic), by request
        self._tasks: set[asyncio.Task] = set()
        self._watches: dict[str, tuple[str, asyncio.Task]] = {}  # watches Redis refused, tried again: by watcher
        self._retrying: Counter[tuple[str, str]] = Counter()  # steps tried again, by request and step
        self._answered = asyncio.Event()  # the probe's: Redis answers again (the paused steps go)
        self._probe: asyncio.Task | None = None  # asking whether Redis answers again

    # -- coming back -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def coming(self, request_id: str) -> Iterator[None]:
        """A resume of the request reached the gateway: a cancel due meanwhile waits for its stream to
        begin, or for it to be refused (raising out of here). Refused because Redis failed it, it counts
        as a read that ended: the grace starts again (its client comes back once Redis does)."""
        now = time.monotonic()
        for rid in [rid for rid, at in self._arrivals.items() if now - at[-1] >= ARRIVAL_S]:
            del self._arrivals[rid]  # (responses that never began)
        arrivals = self._arrivals.setdefault(request_id, [])
        arrivals.append(now)
        try:
            yield
        except redis.RedisError:
            self.reading(request_id)
            self.leave(request_id, uuid.uuid4().hex, clock.now(), finished=False)
            raise
        except BaseException:
            self._arrived(request_id, now)
            raise

    def reading(self, request_id: str) -> None:
        """A stream of the request begins (it leaves in the end): every cancel pending is dropped, and
        one resume on its way has arrived (one still on its way holds the cancels of the reads that
        leave meanwhile: taken with this one's, the request was cancelled under it)."""
        self._arrived(request_id)
        for leave in self._pending.pop(request_id, ()):
            leave.superseded = True

    def _arrived(self, request_id: str, at: float | None = None) -> None:
        """A resume on its way no more: its own arrival (``at``) out, else the oldest one (a read that
        began took this one's: the count is what holds cancels)."""
        arrivals = self._arrivals.get(request_id, [])
        if at in arrivals:
            arrivals.remove(at)
        elif arrivals:
            arrivals.pop(0)
        if not arrivals:
            self._arrivals.pop(request_id, None)

    # -- reading ---------------------------------------------------------------------------------
    async def watch(self, request_id: str, watcher: str, created: float) -> None:
        """A read (``watcher``) of a request made at unix time ``created`` begins: it is marked as a
        reader in Redis. Refused (Redis at its memory limit refuses writes, reads answer), the read goes
        on and the mark is tried again in a task of its own until it goes through, the read ends (its
        leave drops it) or the request's time limit passes: the read of a request that has ended, or
        resumed, died with the refusal (``queue_unavailable``). Meanwhile this gateway cancels nothing
        under it (``reading`` dropped the cancels pending here)."""
        try:
            await self.watching.watch(request_id, watcher)
        except redis.ResponseError:  # (the tries log it)
            leave = Leave(request_id, created + self.time_limit_s, created + self.time_limit_s)
            self._watches[watcher] = (
                request_id,
                self._spawn(self._tried(leave, "watch", lambda: self.watching.watch(request_id, watcher))),
            )

    # -- leaving ---------------------------------------------------------------------------------
    def leave(self, request_id: str, watcher: str, created: float, finished: bool, resumable: bool = True) -> None:
        """A read (``watcher``) of a request made at unix time ``created`` ended: unwatch it, then,
        unless the request ``finished`` or others read it, cancel it (after the grace when its
        client may resume it), in a task of its own."""
        leave = Leave(request_id, created + self.time_limit_s, clock.now() + self.grace_s * resumable)
        self._spawn(self._leave(leave, watcher, finished, resumable))

    def _spawn(self, work: Coroutine[Any, Any, object]) -> asyncio.Task:
        """``work`` in a task of its own, held till it ends (``close`` decides those still pending)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _leave(self, leave: Leave, watcher: str, finished: bool, resumable: bool) -> None:
        rid = leave.request_id
        _, watch = self._watches.pop(watcher, (rid, None))
        try:
            if watch is not None:  # a watch still tried again: unwatched after it, not before
                watch.cancel()
                await asyncio.wait([watch])
            left = await self._tried(leave, "unwatch", lambda: self.watching.unwatch(rid, watcher))
            if finished or left != 0:  # (None: Redis never came back within its time limit)
                return
            # from here a read that begins supersedes it (a read beginning earlier counted in ``left``,
            # or its watch reaches Redis before the grace ends, or it left: its leave decides)
            self._pending.setdefault(rid, set()).add(leave)
            if resumable:
                await asyncio.sleep(self.grace_s)
            await self._tried(leave, "cancel", lambda: self._cancel(leave, resumable))
        except asyncio.CancelledError:  # the gateway stops: its cancel is left to Redis, due as it was
            with contextlib.suppress(redis.RedisError):
                if await self.watching.unwatch(rid, watcher) == 0 and not (finished or leave.superseded):
                    if leave.grace_ends > clock.now():
                        await self.watching.cancel_later(rid, leave.grace_ends)
                    else:
                        await self.watching.cancel_unwatched(rid)
        finally:
            pending = self._pending.get(rid, set())
            pending.discard(leave)
            if not pending:
                self._pending.pop(rid, None)

    async def _cancel(self, leave: Leave, resumable: bool) -> None:
        while any(time.monotonic() - at < ARRIVAL_S for at in self._arrivals.get(leave.request_id, ())):
            await asyncio.sleep(ARRIVAL_POLL_S)  # a resume under way: it reads, or it is turned away
        if leave.superseded or self._watch_tried(leave.request_id):
            return
        deferred = leave.refused and resumable and self.refused_cancel_after_s  # a resume elsewhere may retry its watch
        if deferred and await others_run(self.watching.r, self.gateway):
            await self.watching.cancel_later(leave.request_id, clock.now() + self.refused_cancel_after_s)
        else:
            await self.watching.cancel_unwatched(leave.request_id)

    def _watch_tried(self, request_id: str) -> bool:
        """A read here whose watch Redis refused is tried again: it reads the request (its own leave
        decides) though Redis cannot tell a cancel so yet (one refused write each, the leave's unwatch
        went through first: cancelled at once under the resumed read, at 0 s for a lone gateway)."""
        return any(rid == request_id and not task.done() for rid, task in self._watches.values())

    async def _tried(self, leave: Leave, step: str, attempt: Callable[[], Awaitable[T]]) -> T | None:
        """``attempt``'s result, tried again while Redis fails it (logged once when it fails, once when
        it goes through after: once per request and step, however many of its reads are tried again
        meanwhile: a client resuming every second through an outage logged two lines a try); None
        once the request's time limit has passed."""
        pause, failed, rid = RETRY_S[0], False, leave.request_id
        try:
            while True:
                try:
                    result = await attempt()
                except redis.RedisError as exc:
                    why = str(exc) or type(exc).__name__
                    if clock.now() + pause > leave.deadline:
                        log.warning("request %s: its %s gave up, Redis down to its time limit: %s", rid, step, why)
                        return None
                    if not failed:
                        if not self._retrying[rid, step]:
                            log.warning(
                                "request %s: its %s failed, tried again until Redis answers: %s", rid, step, why
                            )
                        self._retrying[rid, step] += 1
                    failed = leave.refused = True
                    await self._pause(pause, unreached=not isinstance(exc, redis.ResponseError))
                    pause = min(2 * pause, RETRY_S[1])
                    continue
                if failed and self._retrying[rid, step] == 1:
                    log.warning("request %s: its %s went through, Redis back", rid, step)
                return result
        finally:
            if failed:
                self._retrying[rid, step] -= 1
                if not self._retrying[rid, step]:
                    del self._retrying[rid, step]

    async def _pause(self, seconds: float, unreached: bool) -> None:
        """``seconds``, or less while Redis is ``unreached``: till it answers again (a refusal answers:
        its tries keep their pauses)."""
        if not unreached:
            await asyncio.sleep(seconds)
            return
        if self._probe is None or self._probe.done():
            self._answered = asyncio.Event()
            self._probe = self._spawn(self._ask_redis(self._answered))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), seconds)

    async def _ask_redis(self, answered: asyncio.Event) -> None:
        """PING Redis while steps are tried again, till it answers (a refusal too): ``answered`` set."""
        while self._retrying:
            try:
                await asyncio.wait_for(self.watching.ping(), PROBE_S)
            except redis.ResponseError:
                pass
            except (redis.RedisError, TimeoutError):  # (a connection refused fails at once)
                await asyncio.sleep(RETRY_S[0])
                continue
            answered.set()
            return

    async def close(self) -> None:
        """Leave every pending cancel to Redis, due at its grace's end (each tries once more)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.warning("a leave failed while the gateway stopped: %s", outcome)
