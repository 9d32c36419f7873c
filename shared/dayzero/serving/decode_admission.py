"""Decode's admission: what the pools can hold joins the batch, first come first served. A state
is imported from prefill's handoff, then the handoffs of all that arrived are taken in one round
trip (each claimed on arrival; a run over since is dropped), which reads their cancel marks too."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from ..guided import failed_alone, failure
from ..kv.handoff import LayoutMismatch
from ..kv.pools import OutOfBlocks
from .active import Active, admit_state
from .intake import Ticket
from .messages import SAME_LAYOUT, DecodeJob
from .scripts import Take
from .waiting import first_come, latest_runs

if TYPE_CHECKING:
    from .decode_loop import DecodeLoop

log = logging.getLogger("dayzero.decode")


def admit(loop: DecodeLoop) -> None:
    """Admit what the pools can hold, first come first served (waiting.py: none passes one whose
    blocks are not free), in one round trip however many arrive: once their states are imported,
    the takes of their handoffs (each claimed on arrival; a run over since is dropped)."""
    first_come(loop.waiting)
    still, imported, full = [], {}, False
    for ticket in latest_runs(loop.waiting, loop.active):
        loop.heartbeat.moved()  # (many states imported at once take long together)
        job = ticket.job
        rid = job.request.request_id
        if rid in loop._marked:  # cancelled as it waited (read with the last step's tokens): nothing imported
            loop._settle(ticket, "cancelled", index=len(job.generated))
            continue
        total = loop._tokens(job)
        if total > loop.r.pools.capacity_tokens():
            log.error("request %s: %d tokens exceed the decode pools", rid, total)
            loop._settle(ticket, "error", f"{total} tokens exceed the decode pools", len(job.generated))
            continue
        compiled = loop.r.grammar_ready(ticket)  # (its grammar compiles meanwhile, off the loop)
        if full or not loop.r.pools.fits(total):
            still.append(ticket)  # retry when blocks free up
            full = True
            continue
        if not compiled:
            still.append(ticket)  # admitted once compiled: the batch goes on meanwhile
            continue
        try:
            admit_state(loop.r, loop.receiver, job, total)
            loop.heartbeat.state_gone(rid)  # (a state carried through Redis is read: gone from there)
        except LayoutMismatch as exc:  # the deployment's: every re-run would meet it
            log.error("request %s: handoff failed: %s", rid, exc)
            loop._settle(ticket, "error", f"{exc}: {SAME_LAYOUT}", len(job.generated))
            continue
        except (LookupError, OutOfBlocks) as exc:
            log.error("request %s: handoff failed: %s", rid, exc)
            _unimport(loop, [ticket])  # its lease lapses; the reaper re-runs it
            continue
        imported[rid] = ticket
    loop.waiting = still
    # the takes read the cancel marks: ``_cancel`` ends a request cancelled meanwhile before a step
    handoffs = [(rid, t.job.attempt, t.job.state.holder) for rid, t in imported.items()]
    try:
        taken = loop.r.store.take_handoffs(handoffs, loop.r.name, loop.r.settings.lease_s)
    except redis.RedisError:  # their leases lapse and the reaper re-runs them
        _unimport(loop, list(imported.values()))
        raise
    _unimport(loop, [imported[rid] for rid, answer in taken.items() if answer == Take.STALE])
    loop._marked |= {rid for rid, answer in taken.items() if answer == Take.CANCELLED}
    loop._marks_read |= imported.keys()
    for rid, answer in taken.items():
        if answer != Take.STALE:
            _start(loop, imported[rid])
            loop.arrivals.add(loop._tokens(imported[rid].job))


def _unimport(loop: DecodeLoop, tickets: list[Ticket[DecodeJob]]) -> None:
    """Free imported states that will not be generated: a failed take (their leases lapse and the
    reaper re-runs them), or a run over since its claim (re-run during a stall, or ended)."""
    for ticket in tickets:
        loop.r.ranks.release(ticket.job.request.request_id)
        loop.heartbeat.release(ticket.job.request.request_id)
        ticket.done.set()


def _start(loop: DecodeLoop, ticket: Ticket[DecodeJob]) -> None:
    """An imported request joins the batch (or fails alone: its own sampling could not be set up)."""
    rid = ticket.job.request.request_id
    try:
        loop.active[rid] = Active.start(loop.r, ticket, loop.limit)
    except Exception as exc:  # noqa: BLE001 - its own sampling (a grammar refused): it fails alone
        loop.r.ranks.release(rid)
        message, code = failure(exc, "sampling failed")  # (as a step's failure ends it)
        settled = loop._settle(ticket, "error", message, len(ticket.job.generated), code=code)
        failed_alone(loop.r.stats, rid, exc, "sampling failed", counted=bool(settled))
