"""A prefilled prompt's way out of the prefill loop: its first token appended to its stream (time to
first token), then, unless that ends the request, its handoff to decode. Redis failing either leaves
the prompt's state kept (kept_prefills.py) for a retry ``RETRY_S`` later (``again``: a ``prefill.resend``
span each try), which sends what is not out yet; the loop serves the other prompts meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from opentelemetry import trace

from ..guided import LexerFilled, failed_alone, failure
from ..telemetry import continued, tracer
from .intake import Ticket
from .kept_handoffs import KeptHandoffs
from .kept_prefills import RETRY_S, KeptPrefills, Prefilled
from .lease import Heartbeat
from .messages import DecodeJob, PrefillJob
from .outage_log import OutageLog
from .prefilling import Prefilling, end_failed, mark_failed
from .records import Token
from .runtime import Runtime
from .stream_scripts import Settled

log = logging.getLogger("dayzero.prefill")


class FirstTokens:
    def __init__(
        self,
        runtime: Runtime,
        kept: KeptPrefills,
        handed_off: KeptHandoffs,
        heartbeat: Heartbeat,
        decode_message: Callable[[DecodeJob], str],  # a job -> its message on decode's queue
        settle: Callable[..., Settled],  # the loop's: (ticket, reason, message, index, code=)
        limit: int,  # the context's
    ) -> None:
        self.r, self.kept, self.handed_off, self.heartbeat = runtime, kept, handed_off, heartbeat
        self.decode_message, self.settle, self.limit = decode_message, settle, limit
        self._sends_failed = OutageLog(
            log,
            f"redis unavailable (%s); sending again in {RETRY_S:g} s: %s",
            "%d more sends of first tokens failed on Redis since the last line; sending again",
            "first tokens go out again after %.1f s (%d more failed sends since the last line)",
        )

    def first(self, ended: list[Prefilling]) -> list[Ticket[PrefillJob]]:
        """The prompts just prefilled: each request's first token and handoff, its ``prefill.forward``
        span ended with them. -> those Redis failed (``each``), their spans ended so."""
        spans = {id(t): (span, p.done) for p in ended for t, span in zip(p.tickets, p.spans, strict=True)}

        def send(ticket: Ticket[PrefillJob]) -> None:
            span, chunks = spans[id(ticket)]
            span.set_attribute("dayzero.prefilled_chunks", chunks)
            with trace.use_span(span, end_on_exit=True):
                self.send(ticket)

        unsent = self.each([t for p in ended for t in p.tickets], send)
        if unsent:  # (the failed one's span ended with its error; those after it, not tried, end here)
            for p in ended:
                end_failed(p.spans, "first token not sent: Redis failing (sent again: prefill.resend)", p.done)
        return unsent

    def again(self, tickets: list[Ticket[PrefillJob]]) -> list[Ticket[PrefillJob]]:
        """``send`` the kept ``tickets`` again, each in a ``prefill.resend`` span of its own (ERROR if Redis
        fails again). -> those Redis failed (``each``)."""

        def resend(ticket: Ticket[PrefillJob]) -> None:
            job = ticket.job
            attributes = {
                "dayzero.request_id": job.request.request_id,
                "dayzero.attempt": job.attempt,
                "dayzero.first_token_streamed": self.kept.of(ticket).streamed,  # (its handoff alone left)
            }
            with continued(job.request.trace), tracer.start_as_current_span("prefill.resend", attributes=attributes):
                self.send(ticket)

        return self.each(tickets, resend)

    def each(
        self, tickets: list[Ticket[PrefillJob]], send: Callable[[Ticket[PrefillJob]], None]
    ) -> list[Ticket[PrefillJob]]:
        """``send`` each ticket. Redis failing one: it and those after it (not tried: a lost Redis would
        time each one out) stay kept and go again ``RETRY_S`` later, their leases beaten meanwhile, while
        the loop serves the others (it paused as a whole: no other prompt advanced). -> those, and those
        whose grammar waits for a fresh compile (``_first``), for the loop's ``pending``."""
        for i, ticket in enumerate(tickets):
            try:
                send(ticket)
                self._sends_failed.back()
            except redis.RedisError as exc:
                unsent = [t for t in tickets[i:] if not t.done.is_set()]
                rids = [t.job.request.request_id for t in unsent]
                self._sends_failed.failed(exc, ", ".join(rids))
                self.kept.retry_later(unsent)
                self.heartbeat.hold(rids, {t.job.request.request_id: t.job.attempt for t in unsent})
                return [t for t in tickets[:i] if not t.done.is_set()] + unsent
        return [t for t in tickets if not t.done.is_set()]

    def send(self, ticket: Ticket[PrefillJob]) -> None:
        """A prefilled request's first token, then its handoff (what of them is not out yet). Redis
        failing raises (the loop puts it back); any other error fails this request alone."""
        self.heartbeat.moved()  # (a large batch's handoffs, each a state export, take long together)
        try:
            self._emit(ticket)
        except redis.RedisError:
            raise
        except Exception as exc:  # this request's own sampling or handoff
            self._fail(ticket, exc)

    def _fail(self, ticket: Ticket[PrefillJob], exc: Exception) -> None:
        rid = ticket.job.request.request_id
        message, code = failure(exc, "failed after prefill")
        self.handed_off.forget(rid)
        self.r.ranks.release(rid)
        self.kept.drop(ticket)  # (its blocks freed: Redis failing the end puts it back to be prefilled again)
        streamed = len(self.r.store.streamed_tokens(rid))  # its first token may have gone out already
        mark_failed(trace.get_current_span(), message, code)  # its prefill.forward
        settled = self.settle(ticket, "error", message, streamed, code=code)  # (STALE: its re-run's end, and count)
        failed_alone(self.r.stats, rid, exc, "failed after prefill", counted=bool(settled))

    def _first(self, ticket: Ticket[PrefillJob], prefilled: Prefilled) -> Token | None:
        """Its first token: sampled from its logits, or the one whose append Redis failed (``unsent``).
        None while its grammar waits for a fresh compile (its lexer filled by other replies, met by its
        sample: ``LexerFilled``; a re-run, whose replay is decode's, samples nothing here), its completion
        kept for the next try (``again``, once the loop sees that compile ready), its lease beaten meanwhile."""
        job, logits = ticket.job, prefilled.logits
        rid = job.request.request_id
        completion = prefilled.completion or self.r.completion(ticket, job.generated, self.limit)
        unsent = self.kept.unsent.get((rid, job.attempt))
        try:
            # (a held sample's step, once renewed: on the compile the loop saw ready, ``ticket.grammar``)
            ready = completion.waiting and self.r.grammar_ready(ticket)  # (not one its replay just retired)
            step = completion.resume(ticket.grammar) if ready else None
            if step is None and not completion.waiting:
                step = completion.next(logits) if unsent is None else completion.emit(unsent, logits)
        except LexerFilled:
            step = None
        if step is None and prefilled.completion is None:
            log.info("request %s: its grammar's lexer is full; waiting for a fresh compile", rid)
            trace.get_current_span().add_event("lexer_filled")  # (its first token comes in a prefill.resend)
        prefilled.completion = completion if step is None else None
        if step is None:
            return None
        usage = completion.usage() if step.finish_reason else None
        return Token.of(rid, completion.count - 1, step, usage, prefilled.prompt_logprobs)

    def _emit(self, ticket: Ticket[PrefillJob]) -> None:
        job, store, prefilled = ticket.job, self.r.store, self.kept.of(ticket)
        rid = job.request.request_id
        first = None if prefilled.streamed else self._first(ticket, prefilled)
        if first is None and not prefilled.streamed:
            return  # (its grammar compiles: ``again`` sends it once the loop sees it compiled)
        self.heartbeat.release(rid, job.attempt)  # (a re-run here keeps its beats)
        if first is not None:
            self.kept.unsent.pop((rid, job.attempt), None)
            try:
                appended = store.append([first], {rid: job.attempt}, self.r.name, [rid])
                if appended.refused:  # re-run meanwhile
                    self.handed_off.drop_over(rid)
                elif appended.cancelled:  # its client left during the forward: no token, no handoff
                    self.r.ranks.release(rid)
                    self.settle(ticket, "cancelled")
                elif first.finish_reason:
                    self.r.ranks.release(rid)
                    store.settle(rid, job.attempt, self.r.name, first.finish_reason)
            except redis.RedisError:  # the retry sends this token again (a replay of it, if it landed, is skipped)
                self.kept.unsent[rid, job.attempt] = first.token
                raise
            if not (appended.refused or appended.cancelled or first.finish_reason):  # its first token is out
                ticket.job = job.model_copy(update={"generated": (*job.generated, first.token)})
                prefilled.streamed = True  # a retry after Redis fails below hands it off
        if prefilled.streamed:
            self.handed_off.hand_off(ticket.job, self.decode_message)
        self.kept.sent(ticket)
        ticket.done.set()
