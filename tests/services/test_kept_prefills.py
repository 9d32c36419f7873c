"""KeptPrefills: the prefilled prompts whose first token or handoff Redis failed to take, each sent
again ``RETRY_S`` after its failure. ``take`` splits them into those due and those still waiting."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dayzero.serving import kept_prefills
from dayzero.serving.intake import Ticket
from dayzero.serving.kept_prefills import KeptPrefills


def _ticket(request_id: str) -> Ticket:
    return Ticket(SimpleNamespace(request=SimpleNamespace(request_id=request_id), attempt=0))


def test_a_retry_falling_due_while_taken_is_in_one_list(monkeypatch):
    """The clock passes the ticket's retry time while ``take`` splits the kept tickets: it is due or
    waiting, never neither (was: read as waiting, then as due, it left ``pending`` in neither list
    and was never sent again, nor ended: its lease still beaten, its blocks held, its stream silent)."""
    kept, ticket = KeptPrefills(ranks=None), _ticket("r")
    kept.keep(ticket, torch.zeros(4), None)
    kept.of(ticket).retry_at = 100.0  # (its send failed at 99.5)
    readings = iter([99.9, 100.1, 100.1, 100.1])  # (each read of the clock: the retry falls due meanwhile)
    monkeypatch.setattr(kept_prefills.time, "monotonic", lambda: next(readings))
    pending = [ticket]
    due, waiting = kept.take(pending, set())
    assert pending == [] and (due, waiting) in (([ticket], []), ([], [ticket]))


def test_take_keeps_the_order_and_leaves_the_prompts_not_prefilled(monkeypatch):
    kept, a, b, c = KeptPrefills(ranks=None), _ticket("a"), _ticket("b"), _ticket("c")
    for ticket in (a, c):
        kept.keep(ticket, torch.zeros(4), None)
    monkeypatch.setattr(kept_prefills.time, "monotonic", lambda: 10.0)
    kept.retry_later([c])  # (c waits till 10.5)
    pending = [a, b, c]
    assert kept.take(pending, set()) == ([a], [c]) and pending == [b]
