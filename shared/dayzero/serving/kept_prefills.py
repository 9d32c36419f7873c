"""Prompts a prefill worker has prefilled whose first token or handoff has not gone out yet: what
sending it takes, kept till it has gone, so that a retry after Redis failed the send (a refused
write: OOM, BUSY, LOADING, READONLY; or an answer lost) sends again instead of prefilling again.

Kept: the prompt's attention state (its blocks, reserved at its admission: nothing more is
allocated for it), the next-token logits of its last position (a row of its batch's), its prompt
logprobs, and the first token sampled from them whose append raised (it may have landed: the retry
sends that token, never a new sample). The blocks go as the request is handed to decode, ends (its
first token the last, a cancel, DAYZERO_TASK_TIME_LIMIT_S, a failure), or its run is found over (the
reaper re-ran it): whichever comes first, the loop frees them; nothing else is held meanwhile.
A prompt whose send Redis failed waits ``RETRY_S`` for the next try, alone: the loop serves the
others meanwhile (their chunks, their sends); so does one whose first token waits for a fresh
compile of its grammar (its lexer filled by other replies: ``Prefilled.completion``).
"""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..params import Logprob
from .intake import Ticket
from .messages import PrefillJob
from .ranks import Ranks

if TYPE_CHECKING:
    from ..completion import Completion


@dataclass(slots=True)
class Prefilled:
    ticket: Ticket[PrefillJob]
    logits: torch.Tensor  # [V]: the next token's, at the prompt's last position
    prompt_logprobs: list[Logprob] | None
    streamed: bool = False  # its first token (a re-run's: its last) is on the stream: its handoff is left to send
    retry_at: float = 0.0  # (time.monotonic()) its last send Redis failed: not sent again before this
    # its first token's completion while its grammar waits for a fresh compile (its lexer filled by
    # other replies: ``Completion.waiting``), kept whole: a rebuild would forget whose that failure is
    completion: Completion | None = None


RETRY_S = 0.5  # a send Redis failed goes again after this (the loop's pause for any other Redis failure)


class KeptPrefills:
    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.states: dict[tuple[str, int], Prefilled] = {}  # (request, run) -> its state, its blocks held
        # (request, run) -> its first token, whose append raised: it may have landed (an answer lost past
        # the command timeout), so the retry (prefilled again here: no peer's) sends it, not a new sample
        self.unsent: dict[tuple[str, int], int] = {}

    def __bool__(self) -> bool:
        return bool(self.states)

    def keep(
        self,
        ticket: Ticket[PrefillJob],
        logits: torch.Tensor,
        prompt_logprobs: list[Logprob] | None,
        streamed: bool = False,  # a re-run's: no first token to sample, its handoff alone to send
    ) -> None:
        """``ticket``'s prompt is prefilled (its blocks hold its state): kept till it is ``sent``."""
        self.states[_run(ticket)] = Prefilled(ticket, logits, prompt_logprobs, streamed)

    def of(self, ticket: Ticket[PrefillJob]) -> Prefilled:
        return self.states[_run(ticket)]

    def holds(self, ticket: Ticket[PrefillJob]) -> bool:
        """Whether ``ticket``'s prompt is prefilled here (a duplicate delivery of its run is not)."""
        state = self.states.get(_run(ticket))
        return state is not None and state.ticket is ticket

    def sent(self, ticket: Ticket[PrefillJob]) -> None:
        """Its first token and handoff went (or its request ended): its blocks are the handoff's now, or freed."""
        self.states.pop(_run(ticket), None)

    def drop(self, ticket: Ticket[PrefillJob]) -> None:
        """Its request ends here without a handoff: its blocks, if kept, and its unsent token go."""
        self.unsent.pop(_run(ticket), None)
        if self.holds(ticket):
            del self.states[_run(ticket)]
            self.ranks.release(ticket.job.request.request_id)

    def retry_later(self, tickets: list[Ticket[PrefillJob]]) -> None:
        """Redis failed their sends: each is sent again ``RETRY_S`` from now, not before."""
        at = time.monotonic() + RETRY_S
        for ticket in (t for t in tickets if self.holds(t)):
            self.of(ticket).retry_at = at

    def waits(self, ticket: Ticket[PrefillJob]) -> bool:
        """Whether ``ticket`` is prefilled here and waits for its send's retry (``retry_later``)."""
        return self.holds(ticket) and self.of(ticket).retry_at > time.monotonic()

    def take(
        self, pending: list[Ticket[PrefillJob]], compiled: Container[int]
    ) -> tuple[list[Ticket[PrefillJob]], list[Ticket[PrefillJob]]]:
        """The tickets of ``pending`` that are prefilled (sent again, never prefilled again), taken out of
        it in order: (those to send now, those waiting for their retry or, with a ``completion`` kept,
        for their grammar's fresh compile: ``id(ticket)`` not in ``compiled``)."""
        kept = [t for t in pending if self.holds(t)]
        pending[:] = [t for t in pending if not self.holds(t)]
        now, due, waiting = time.monotonic(), [], []  # (one reading of the clock: read once per list, a retry
        for ticket in kept:  # falling due in between put its ticket in neither, lost)
            state = self.of(ticket)
            compiling = state.completion is not None and id(ticket) not in compiled
            (waiting if state.retry_at > now or compiling else due).append(ticket)
        return due, waiting

    def requests(self) -> set[str]:
        """The requests whose first token may be on their stream already: no peer may take them (it
        would sample another), nor prefill them anew (room.py)."""
        return {rid for rid, _ in (*self.states, *self.unsent)}


def _run(ticket: Ticket[PrefillJob]) -> tuple[str, int]:
    return ticket.job.request.request_id, ticket.job.attempt
