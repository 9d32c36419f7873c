"""Jobs handed from Celery task threads to a stage's loop thread; each task waits for its job.

The task holds its message unacked until the loop sets the job's event, so a worker that
dies with work in flight leaves the message to be redelivered.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Job = TypeVar("Job")


@dataclass
class Ticket(Generic[Job]):
    job: Job
    done: threading.Event = field(default_factory=threading.Event)


class Intake(Generic[Job]):
    def __init__(self) -> None:
        self._queue: queue.Queue[Ticket[Job]] = queue.Queue()

    def submit(self, job: Job) -> Ticket[Job]:
        ticket = Ticket(job)
        self._queue.put(ticket)
        return ticket

    def drain(self, wait_s: float) -> list[Ticket[Job]]:
        """Everything waiting; blocks up to ``wait_s`` for the first one."""
        items: list[Ticket[Job]] = []
        try:
            items.append(self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait())
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            return items
