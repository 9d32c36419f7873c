"""A failure that repeats while Redis is out, in the log without a line per failure.

A gateway answered 503 to every request during an outage with a line each (2,673 lines in the
soak's outages); a worker retries its loop every 0.5 s, its heartbeats every third of a lease, a
claim every 0.5 s, each with a line: 100-350 lines per worker in a 35 s outage at a 1 s lease. One
``OutageLog`` per such place says the first failure at once, with its reason, then at most a line
per ``every_s`` counting those since, and, where the place can tell (its next call went through:
``back``), a line when Redis is back, with how long it was out and the failures not said yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..redis_refusals import told

LOGGED_EVERY_S = 10.0  # a failure that repeats: a line at most this often, with the count since


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def on_a_thread(delay_s: float, call: Callable[[], None]) -> Cancellable:
    """``call()`` after ``delay_s`` on a daemon thread of its own (the workers' timer)."""
    timer = threading.Timer(delay_s, call)
    timer.daemon = True
    timer.start()
    return timer


class OutageLog:
    """``failed(*args)``: logs ``first % args`` at once, then, for ``every_s`` after each line, counts
    the failures instead, into ``counted % count`` once the ``every_s`` is over (a timer: ``later``,
    a thread's by default; the gateway's, its event loop's): the last ones of an outage are said
    too. ``back()``: the call that failed went through; an outage whose failure was said ends with
    ``ended % (seconds out, failures not said yet)`` (None: no such line; ``to_last_failure``: the
    seconds from the first failure to the last, for a place whose calls are far apart, where its
    next call that went through may come long after the outage). A failure within
    ``every_s`` of that line is counted, not said at once: a place that calls ``back`` after a pass
    that did not reach Redis (an idle loop's) logs a line per ``every_s`` at most, not two per
    flap. Thread-safe."""

    def __init__(
        self,
        log: logging.Logger,
        first: str,
        counted: str,
        ended: str | None = None,
        every_s: float = LOGGED_EVERY_S,
        later: Callable[[float, Callable[[], None]], Cancellable] = on_a_thread,
        to_last_failure: bool = False,
    ) -> None:
        self.log, self.first, self.counted, self.ended = log, first, counted, ended
        self.to_last_failure = to_last_failure
        self.every_s, self.later = every_s, later
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage's first failure came (monotonic; None: none now)
        self._last = 0.0  # when its last failure came (monotonic)
        self._said = False  # a line of this outage was logged: its end is said too
        self._logged_at, self._unlogged = float("-inf"), 0
        self._tally: Cancellable | None = None  # the line that will count the failures since the last

    def failed(self, *args: Any) -> None:
        with self._lock:
            if self._said_now():  # (a refused command: said as one, not as Redis unavailable)
                self.log.warning(self.first, *(told(a) if isinstance(a, BaseException) else a for a in args))

    def passes(self) -> bool:
        """``failed`` for a failure that says itself (a log record: ``BrokerOutageFilter``): whether
        it is said now, as ``first`` would be (else it is counted)."""
        with self._lock:
            return self._said_now()

    def _said_now(self) -> bool:
        """A failure (the lock held): to be said now, or counted (False)."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self._last = now
        if self._tally is not None or now - self._logged_at < self.every_s:  # (the tally may run late)
            self._unlogged += 1
            if self._tally is None:
                self._tally = self.later(self._logged_at + self.every_s - now, self._count)
            return False
        self._logged_at, self._said = now, True
        return True

    def _count(self) -> None:
        with self._lock:
            if self._tally is None:  # (``back`` said them meanwhile)
                return
            self._tally = None
            self.log.warning(self.counted, self._unlogged)
            self._logged_at, self._unlogged, self._said = time.monotonic(), 0, self._since is not None

    def back(self) -> None:
        """The call that failed went through (cheap when nothing failed: the hot paths call it)."""
        if self._since is None:
            return
        with self._lock:
            if self._since is None:
                return
            if self._said and self.ended is not None:
                if self._tally is not None:
                    self._tally.cancel()
                    self._tally = None
                self._logged_at = time.monotonic()
                out_s = (self._last if self.to_last_failure else self._logged_at) - self._since
                self.log.warning(self.ended, out_s, self._unlogged)
                self._unlogged = 0
            self._since, self._said = None, False  # (not said: the tally counts its failures)


class BrokerOutageFilter(logging.Filter):
    """Celery's own lines of a lost broker connection, bounded as an ``OutageLog`` bounds dayzero's:
    its consumer's warnings and errors ("Connection to broker lost", then "Cannot connect to ...
    Trying again in N seconds" at each of its tries, a second apart (reconnect.py; kombu's were 2,
    4, 6, ... s apart), three lines each) pass while the outage's first or the first a period after
    the last line; the rest are counted (a line per period, from ``log``). Its "Connected to" line passes
    too, after a line that says how long the connection was lost and how many lines were held back.
    On the loggers of ``LOGGERS`` (``install``)."""

    LOST = "celery.worker.consumer.consumer"  # "Connection to broker lost", "Cannot connect to ..."
    BACK = "celery.worker.consumer.connection"  # "Connected to redis://..."
    LOGGERS = (LOST, BACK)

    def __init__(
        self,
        log: logging.Logger,
        every_s: float = LOGGED_EVERY_S,
        later: Callable[[float, Callable[[], None]], Cancellable] = on_a_thread,
    ) -> None:
        super().__init__()
        self.outage = OutageLog(
            log,
            "%s",  # (not used: each first line is Celery's own)
            "%d more of Celery's broker connection lines held back since the last",
            "the broker connection is back after %.1f s (%d more of Celery's lines about it held back since the last)",
            every_s,
            later,
        )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == self.LOST and record.levelno >= logging.WARNING:
            return self.outage.passes()
        if record.name == self.BACK:
            self.outage.back()
        return True

    def install(self) -> BrokerOutageFilter:
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self
