"""Requests a worker has claimed that wait for their turn and their KV blocks (decode's ``waiting``,
prefill's ``pending``): first come, first served.

First come: in the order of their admission (``created``, the time limit's clock), so a request
re-run after a worker failure, or handed back by a decode peer (room.py), keeps its place ahead of
later ones. Admission stops at the first request whose blocks are not free, as vLLM's FCFS scheduler
does: a worker's blocks come free only as its own requests end, and when later, smaller requests
took them as they came, a large one could wait for ever. Behind it the later ones wait; on decode,
room.py hands any of them (it first) to a peer with room for it.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Protocol, TypeVar

from .intake import Ticket
from .messages import GenerationRequest


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
