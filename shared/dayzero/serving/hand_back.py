"""A stopping worker's hand back of the requests it holds (``StageWorker._hand_back``): each goes to a
live peer of its stage at once, not after the grace, its lease's lapse and the reaper's next sweep."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from .intake import Ticket
from .lease import Heartbeat
from .lifecycle import Lifecycle
from .messages import PrefillJob
from .reaper import rerun

log = logging.getLogger("dayzero.serving")


def handing_back(
    store: Lifecycle, owner: str, messages: Mapping[str, Callable[[PrefillJob], str]], queued_s: float, grace_s: float
) -> Callable[[str, int, bool], bool]:
    """``owner``'s hand back of a run it holds, ``(request, attempt, spared)`` -> whether it was re-run: at once,
    as a sweep re-runs a lapsed lease (``reaper.rerun``: from the tokens streamed, attempt + 1), its message
    at the front of its first stage's queue, the next read's (``messages``: a stage's job -> its message),
    its queued mark held ``queued_s`` (the broker's visibility). Till the push the mark holds ``grace_s``:
    the process ends within it, and one ended before its push leaves the request to a sweep after that."""

    def send(job: PrefillJob, stage: str) -> None:
        store.hand_on(job.request.request_id, job.attempt, "", stage, messages[stage](job), queued_s, front=True)

    def hand_back(rid: str, attempt: int, spared: bool = False) -> bool:  # spared: a clean stop's (no failure)
        run = store.rerun_held(rid, attempt, owner, grace_s, spared)
        return bool(run) and rerun(store, send, rid, run, "was handed back by its stopping worker")

    return hand_back


def hand_back(
    tickets: Iterable[Ticket[Any]],
    heartbeat: Heartbeat,
    rerun_run: Callable[[str, int], bool],
    push: Callable[[Any, str], bool] | None = None,
) -> None:
    """Each ticket's request (its loop ended) goes to a live peer: ``push(job, request)`` (a waiting one back to
    its stage's queue, its state kept: ``Room.push``), else re-run (``rerun_run(request, attempt)``:
    ``handing_back``), and its task ends. A run over or someone else's is left alone (the fence); one Redis
    failed for is left to the reaper: its lease lapses, the beats ended with the loop."""
    for ticket in tickets:
        job = ticket.job
        rid = job.request.request_id
        heartbeat.release(rid)
        try:
            if push is None or not push(job, rid):
                rerun_run(rid, job.attempt)
        except redis.RedisError as exc:
            log.warning("request %s: its hand back failed (%s); its lease lapses for the reaper", rid, exc)
        ticket.done.set()
