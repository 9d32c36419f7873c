"""Keeping requests' leases alive while long pieces of work run on them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import redis

from .intake import Ticket
from .lifecycle import Lifecycle
from .outage_log import OutageLog
from .scripts import Take

log = logging.getLogger("dayzero.lease")


class Heartbeat:
    """Refreshes the leases (owned by ``owner``) of the requests it holds, every third of a lease,
    on one thread that starts with the first ``holding`` and ends when ``stop`` is set (``beats_until``
    if given: a stop that gives up claims and keeps beating the work under way): a batch starts no
    thread of its own. A claimed run's lease that lapsed (Redis out, or a step run, past a
    lease) is taken back if no re-run of it began: else each outage longer than a lease re-ran it.

    A ``step`` (or ``holding``) block running past ``stuck_s`` (a forward that never returns: a
    hung kernel, a deadlock) is taken as a hung worker: the beats stop, the leases lapse and the reaper
    re-runs the requests, as it would a frozen process's; the fenced runs keep a step that returns
    after all from writing. Else a hung step held its requests, and their streams, for ever.

    A loop that calls ``moved`` as it goes (each iteration, each step's end: a timestamp in memory)
    and then moves on no more for ``stalled_s`` outside a step (blocked between two steps: a deadlock,
    a call that never returns) is stuck alike; a step, however long, is judged by ``stuck_s`` alone,
    and a loop that has not moved yet (the weights loading) by neither.

    The states of the requests it claimed parked in Redis (decode's, handed off through Redis:
    ``claim(parked=)``) are kept alive with their leases till read (``state_gone``); no other claim or
    beat reads their keys."""

    def __init__(
        self,
        store: Lifecycle,
        owner: str,
        lease_s: float,
        stop: threading.Event,
        stuck_s: float | None = None,
        stalled_s: float | None = None,
        beats_until: threading.Event | None = None,
    ) -> None:
        self._store, self._owner, self._lease_s, self._stop, self._stuck_s = store, owner, lease_s, stop, stuck_s
        self._beats_until = stop if beats_until is None else beats_until
        self._stalled_s = stalled_s
        self._ids: set[str] = set()
        self._parked: set[str] = set()  # of those, the requests whose states wait in Redis (till read)
        self._runs: dict[str, int] = {}  # request -> the run (attempt) this worker last claimed of it
        self._lock = threading.Lock()  # a beat in flight finishes before a release returns
        self._thread: threading.Thread | None = None
        self._block_since: float | None = None  # when the running ``step`` began (monotonic)
        self._moved_at: float | None = None  # when the loop last moved on (monotonic; None: not yet)
        self._reported: float | None = None  # the step or stall last logged as stuck
        self._lost: set[str] = set()  # leases the last beat found lost (each logged once)
        self._beats_failed = OutageLog(
            log,
            "heartbeat failed (%s); retrying",
            "%d more heartbeats failed on Redis since the last line; retrying",
            "heartbeats go through again after %.1f s (%d more failed since the last line)",
        )
        self._claims_failed = OutageLog(
            log,
            "redis unavailable (%s); retrying the claim of %s",
            "%d more tries of claims failed on Redis since the last line; retrying",
            "claims go through again after %.1f s (%d more failed tries since the last line)",
        )

    def moved(self) -> None:
        """The loop moved on (an iteration began, a step ended, a request was taken on or handed on):
        no round trip, a timestamp."""
        self._moved_at = time.monotonic()

    def stuck(self) -> bool:
        """The running ``step`` has run past ``stuck_s``, or the loop, between steps, has not moved for
        ``stalled_s``."""
        return self._stuck() is not None

    def _stuck(self) -> tuple[float, str] | None:
        """Since when, and why, it is stuck; None if it is not."""
        now, since = time.monotonic(), self._block_since  # (first: a step's end moves the loop on, then clears it)
        if since is not None:
            limit, why = self._stuck_s, "a step has run past %g s"
        else:
            since, limit, why = self._moved_at, self._stalled_s, "the loop has not moved between steps for %g s"
        if since is None or limit is None or now - since <= limit:
            return None
        return since, why % limit

    def _beat(self) -> None:
        while not self._beats_until.wait(self._lease_s / 3):
            with self._lock:
                stuck = self._stuck()
                if stuck is not None:
                    if stuck[0] != self._reported:
                        self._reported = stuck[0]
                        log.warning("%s; letting its leases lapse", stuck[1])
                    continue
                if not self._ids:  # nothing to beat, no round trip: it cannot tell Redis is back
                    self._lost.clear()  # (their owners dropped them: one taken again and lost is new)
                    continue
                try:
                    lost = self._store.heartbeat(
                        sorted(self._ids), self._owner, self._lease_s, self._runs, self._parked
                    )
                    if new := [rid for rid in lost if rid not in self._lost]:  # (beaten till its owner drops it)
                        log.warning("leases lost during a long piece of work: %s", ", ".join(new))
                    self._lost = set(lost)  # lapsed or re-run elsewhere while the work ran: its owner settles it
                    self._beats_failed.back()
                except redis.RedisError as exc:
                    self._beats_failed.failed(exc)

    def claim(
        self,
        ticket: Ticket[Any],
        cancelled: Callable[[Ticket[Any]], None],
        handed_off: bool = False,
        dropped: Callable[[Ticket[Any]], None] | None = None,
        parked: bool = False,
    ) -> bool:
        """A loop's ``Intake`` claim, on the delivering task's thread as the message arrives: take the
        request for the owner (``Lifecycle.take``; ``handed_off``: decode's, from the handoff) and
        beat for it from then on, until it is handed on or ended. A worker that dies with requests
        waiting (for its loop, for blocks, for room in decode's batch) lets their leases lapse, and
        the reaper re-runs them within seconds; queued marks would keep the reaper away for the
        visibility timeout (the broker, without ack emulation, never delivers a dead worker's
        messages again). While Redis restarts the take is retried, until ``stop`` is set. False: the
        ticket is settled here: ``cancelled(ticket)`` for a cancelled request, done for a stale
        delivery, an ended request, one a live worker holds, or a take given up on stopping; the
        first two and the last (no run will read what the message carries) after ``dropped(ticket)``.
        ``parked``: its state waits in Redis; this claim and every beat keep it alive till ``state_gone``."""
        rid, attempt = ticket.job.request.request_id, ticket.job.attempt
        with self._lock:  # (a run held here whose state waits: a refused claim beside it leaves it named)
            kept = rid in self._parked
        if parked:
            self.state_parked(rid)
        while True:
            try:
                taken = self._store.take(rid, attempt, self._owner, self._lease_s, handed_off, parked)
                self._claims_failed.back()
                break
            except redis.RedisError as exc:
                self._claims_failed.failed(exc, rid)
                if self._stop.wait(0.5):
                    taken = Take.STALE  # stopping: its message left the queue unclaimed; the reaper re-runs it
                    break
        if taken != Take.CLAIMED and not kept:
            self.state_gone(rid)  # (never beaten)
        if taken == Take.CLAIMED:
            with self._lock:
                self._runs[rid] = attempt
            self.hold([rid])
        elif taken == Take.CANCELLED:
            cancelled(ticket)
        else:
            if taken == Take.STALE and dropped is not None:
                dropped(ticket)
            ticket.done.set()
        return taken == Take.CLAIMED

    def hold(self, ids: list[str], runs: Mapping[str, int] | None = None) -> None:
        """Beat for ``ids`` until each is ``release``d; ``runs`` (id -> attempt): the runs of those held
        again after a release (a send or push Redis failed), whose leases a beat may take back."""
        with self._lock:
            self._ids.update(ids)
            for rid, attempt in (runs or {}).items():
                if not self._later(rid, attempt):
                    self._runs[rid] = attempt
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
                self._thread.start()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """A step of the loop (a forward): once it has run past ``stuck_s`` no lease is beaten."""
        self._block_since = time.monotonic()
        try:
            yield
        finally:
            self.moved()  # (before the step's start is cleared: no stall is read from before the step)
            with self._lock:
                self._block_since = None

    @contextlib.contextmanager
    def holding(self, ids: list[str]) -> Iterator[Heartbeat]:
        """Beat for ``ids`` until the block (a step) ends, or until each is ``release``d."""
        self.hold(ids)
        try:
            with self.step():
                yield self
        finally:
            with self._lock:
                self._ids.difference_update(ids)

    def state_parked(self, request_id: str) -> None:
        """The request's state waits in Redis (kvstate): the beats keep it alive with the lease."""
        with self._lock:
            self._parked.add(request_id)

    def state_gone(self, request_id: str) -> None:
        """The request's state is no more in Redis for this worker to keep (read out of it, or its claim
        failed): the beats name it no more (each read it, a missing key, while its request generated)."""
        with self._lock:
            self._parked.discard(request_id)

    def release(self, request_id: str, attempt: int | None = None) -> None:
        """No more beats for ``request_id``: none in flight can overwrite what its owner writes next
        (a handoff lease, its end). ``attempt``: the run that is done with it; the beats go on while
        this worker holds a later run of the request (claimed while that one ran: it was re-run and
        its message came here)."""
        with self._lock:
            if attempt is not None and self._later(request_id, attempt):
                return
            self._ids.discard(request_id)
            self._parked.discard(request_id)
            self._runs.pop(request_id, None)

    def over(self, request_id: str, attempt: int) -> bool:
        """Whether this worker's run ``attempt`` of the request is over: its lease lapsed and the request
        was re-run (a later run of it claimed here, or the lease nobody's or another's), or it ended.
        Over, the run is beaten no more."""
        with self._lock:
            later = self._later(request_id, attempt)
        if later or self._store.owner(request_id) != self._owner:
            self.release(request_id, attempt)
            return True
        return False

    def _later(self, request_id: str, attempt: int) -> bool:
        return self._runs.get(request_id, attempt) > attempt
