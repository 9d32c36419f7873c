"""Jobs handed from Celery task threads to a stage's loop thread; each task waits for its job.

The task holds its message unacked until the loop sets the job's event (its prefetch slot stays
taken meanwhile); a worker that dies with work in flight leaves its requests' leases to lapse, and
the reaper re-runs them (reaper.py). The loop thread itself must never die: ``run_loop`` keeps it
iterating through Redis outages and bugs.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import redis

from .outage_log import OutageLog

Job = TypeVar("Job")


@dataclass
class Ticket(Generic[Job]):
    job: Job
    done: threading.Event = field(default_factory=threading.Event)
    images: object = None  # prefill: the parked image embeddings once taken (read once: a retry reuses them)
    grammar: object = None  # its grammar's compile once done, held (Runtime.grammar_ready)


class Intake(Generic[Job]):
    """``claim(ticket)`` runs on the submitting (task) thread as the job arrives: False when it
    settled the ticket itself, and the loop never sees it."""

    def __init__(self, claim: Callable[[Ticket[Job]], bool] = lambda ticket: True) -> None:
        self._queue: queue.Queue[Ticket[Job]] = queue.Queue()
        self._claim = claim
        self._lock = threading.Lock()  # (a submit's put, or its hand back, and ``close``: one or the other)
        self._closed: Callable[[Ticket[Job]], None] | None = None

    def submit(self, job: Job) -> Ticket[Job]:
        ticket = Ticket(job)
        if self._claim(ticket):
            with self._lock:
                closed = self._closed
                if closed is None:
                    self._queue.put(ticket)
            if closed is not None:  # (its loop handed back what it held: no loop takes it)
                closed(ticket)
        return ticket

    def close(self, hand_back: Callable[[Ticket[Job]], None]) -> list[Ticket[Job]]:
        """Stopping, the loop hands back what it holds: -> the tickets waiting; one claimed from now (a
        delivery under way as the stop came) goes to ``hand_back`` on its task's thread, not to a queue
        no loop drains (its task held the warm shutdown to the grace, its lease left to lapse)."""
        with self._lock:
            self._closed = hand_back
            return self.drain(0)

    def drain(self, wait_s: float) -> list[Ticket[Job]]:
        """Everything waiting; blocks up to ``wait_s`` for the first one."""
        items: list[Ticket[Job]] = []
        try:
            items.append(self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait())
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            return items


def run_loop(
    stop: threading.Event, iteration: Callable[[], None], log: logging.Logger, moved: Callable[[], None]
) -> None:
    """Call ``iteration`` until ``stop`` is set, ``moved()`` before each (the loop's progress, which
    its worker's liveness reads: an idle loop's intake wakes it every 50 ms). Redis restarting or an
    unexpected error pauses the loop, never ends it: the tasks waiting on its jobs would wait forever.
    An outage is logged at its start, each ``LOGGED_EVERY_S`` and at its end (outage_log.py)."""
    outage = OutageLog(
        log,
        "redis unavailable (%s); retrying",
        "%d more passes of the loop failed on Redis since the last line; retrying",
        "the loop reaches Redis again after %.1f s (%d more failed passes since the last line)",
    )
    while not stop.is_set():
        moved()
        try:
            iteration()
            outage.back()
        except redis.RedisError as exc:  # Redis restarting: keep state, retry
            outage.failed(exc)
            stop.wait(0.5)
        except Exception:
            log.exception("unexpected error in the loop; continuing")
            stop.wait(0.5)
