"""Requests a worker has claimed that wait for their turn and their KV blocks (decode's ``waiting``,
prefill's ``pending``): first come, first served, and none past DAYZERO_TASK_TIME_LIMIT_S. One whose
grammar compiles (off the loop) waits for it, and the others pass it meanwhile.

First come: in the order of their admission (``created``, the time limit's clock), so a request
re-run after a worker failure, or handed back by a decode peer (room.py), keeps its place ahead of
later ones. Admission stops at the first request whose blocks are not free, as vLLM's FCFS scheduler
does: a worker's blocks come free only as its own requests end, and when later, smaller requests
took them as they came, a large one could wait for ever. Behind it the later ones wait; room.py hands
any of them (it first) to a peer with room for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Protocol, TypeVar

from .intake import Ticket
from .messages import GenerationRequest, PrefillJob
from .runtime import Runtime
from .time_limit import overdue, past_limit

log = logging.getLogger("dayzero.serving")


class Claimed(Protocol):  # a stage's job: PrefillJob, DecodeJob
    @property
    def request(self) -> GenerationRequest: ...


class Run(Claimed, Protocol):
    @property
    def attempt(self) -> int: ...


J = TypeVar("J", bound=Claimed)
R = TypeVar("R", bound=Run)


def first_come(tickets: list[Ticket[J]]) -> None:
    """Order ``tickets`` by admission, in place (stable: a request's choices keep their order)."""
    tickets.sort(key=lambda ticket: ticket.job.request.created)


def compiled(tickets: list[Ticket[PrefillJob]], runtime: Runtime) -> list[Ticket[PrefillJob]]:
    """The prompts (in order) that need not wait for a grammar's compile (runtime.py): a re-run's never
    does, its prefill samples nothing (decode replays its tokens and feeds the last: ``prefilled_ids``)."""
    return [t for t in tickets if t.job.generated or runtime.grammar_ready(t)]


def end_overdue(tickets: list[Ticket[J]], runtime: Runtime, settle: Callable[..., object]) -> None:
    """End the requests of ``tickets`` admitted longer ago than DAYZERO_TASK_TIME_LIMIT_S, and take them
    out: one that has streamed tokens (any decode holds; a re-run in prefill) with "length", one that
    has streamed none (in prefill) with a 503 ``overloaded`` (time_limit.py), after the tokens its
    stream holds (read from it: a job's own may lack one whose append landed though Redis failed to
    answer, and is retried). ``settle(ticket, reason, message, index=, usage=, code=, text=)``: the loop's."""
    limit_s, stage = runtime.settings.task_time_limit_s, runtime.stats.stage
    for ticket in [t for t in tickets if overdue(t.job.request.created, limit_s)]:
        request = ticket.job.request
        log.warning("request %s: waited in %s past DAYZERO_TASK_TIME_LIMIT_S; ending it", request.request_id, stage)
        end = past_limit(runtime.codec, request, runtime.store.streamed_tokens(request.request_id), limit_s)
        settle(ticket, end.reason, end.message, index=end.index, usage=end.usage, code=end.code, text=end.text)
        tickets.remove(ticket)  # (once settled: Redis failing leaves it for the next try)


def latest_runs(tickets: list[Ticket[R]], running: Container[str]) -> list[Ticket[R]]:
    """The tickets (in order) of the requests not ``running`` yet, each request's latest run once;
    the others (a duplicate delivery, or an older run's while a re-run's waits: stale) are done."""
    latest: dict[str, int] = {}
    for ticket in tickets:
        rid = ticket.job.request.request_id
        latest[rid] = max(latest.get(rid, 0), ticket.job.attempt)
    kept, seen = [], set()
    for ticket in tickets:
        rid = ticket.job.request.request_id
        if rid in running or rid in seen or ticket.job.attempt < latest[rid]:
            ticket.done.set()
        else:
            seen.add(rid)
            kept.append(ticket)
    return kept
