"""The prefill stage's loop: pack waiting prompts, run prefill, stream the first token, hand off.

Each prompt is ``prompt + tokens already streamed but the last`` (non-empty only when a request
is re-run after a worker failure: no token is sampled here, decode feeds the last one streamed as
a decode round would have), prefilled a chunk per step (prefilling.py plans the steps): each
step packs the prompts under way with newly arrived ones, up to DAYZERO_MAX_PREFILL_TOKENS, so a
short prompt does not wait for a long one to end, and a prompt whose client cancelled it stops
between two chunks. The first sampled token is appended to the request's stream at once (time to
first token); unless it ends the request, the attention state is published for decode and its
blocks stay leased until decode takes them or the lease expires. Redis failing on the way puts the
request back with its state kept (kept_prefills.py): its first token, if sampled, and its handoff
are sent again (not sampled anew, nor prefilled again) a moment later, the other prompts served meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container

import redis

from ..config import context_limit
from ..kv.pools import OutOfBlocks
from . import redis_clock as clock
from .first_tokens import FirstTokens
from .hand_back import hand_back
from .intake import Intake, Ticket, run_loop
from .kept_handoffs import KeptHandoffs
from .kept_prefills import KeptPrefills
from .lease import Heartbeat
from .messages import DecodeJob, PrefillJob
from .parked import discard_tensor, drop_embeddings
from .prefill_batch import forward_of
from .prefilling import Prefilling, batch_input, end_failed, forward_span, plan_step, take_batch, tokens_of
from .room import Room, let_go
from .runtime import Runtime
from .stream_scripts import Settled
from .waiting import compiled, end_overdue, first_come

log = logging.getLogger("dayzero.prefill")


class PrefillLoop:
    def __init__(self, runtime: Runtime, decode_message: Callable[[DecodeJob], str], room: Room | None = None) -> None:
        self.r = runtime
        self.room = room  # what its blocks cannot hold goes to a peer with room (room.py)
        self.intake: Intake[PrefillJob] = Intake(
            lambda ticket: self.heartbeat.claim(
                ticket,
                lambda cancelled: self._settle(cancelled, "cancelled"),
                dropped=lambda t: drop_embeddings(t.job.embeddings, runtime.store),
            )
        )
        self.pending: list[Ticket[PrefillJob]] = []
        self.running: list[Prefilling] = []  # prompts under way, a chunk per step
        self.stepping: list[Prefilling] = []  # those in the step under way (out of ``running`` till it ends)
        self.handed_off = KeptHandoffs(runtime)
        self.kept = KeptPrefills(runtime.ranks)  # prefilled, their first token or handoff not out yet
        self.starved = False  # the last batch admitted nothing: its requests wait for blocks
        self.stop = threading.Event()
        # hung: a forward past the time limit (a long prompt's may pass the group's timeout), the loop blocked
        # between forwards past the group's (the worker then stamps no liveness)
        s, store = runtime.settings, runtime.store
        self.heartbeat = Heartbeat(store, runtime.name, s.lease_s, self.stop, s.task_time_limit_s, s.group_timeout_s)
        limit = context_limit(runtime.model.cfg, s.max_context)
        self.sender = FirstTokens(  # a prefilled prompt's way out: its first token, its handoff
            runtime, self.kept, self.handed_off, self.heartbeat, decode_message, self._settle, limit
        )

    def run_forever(self) -> None:
        run_loop(self.stop, self._iteration, log, self.heartbeat.moved)

    def _iteration(self) -> None:
        ready = compiled(self.pending, self.r)  # (asked once an iteration: the others' compile off the loop)
        # idle, or every request waiting for blocks, its grammar or its send's retry: wait for the next arrival
        held = bool(self.pending) and (self.starved or all(self.kept.waits(t) for t in ready))
        arrived = self.intake.drain(0.05 if not self.running and (held or not self.pending) else 0)
        self.pending.extend(arrived)
        waiting = len(self.pending) + sum(len(p.tickets) for p in self.running) or 1
        if self.running or held or self.kept:  # (a request alone on an idle worker: no round trip)
            self._end_cancelled()  # between two chunks of a prompt, and of the requests waiting meanwhile
        self.starved = False
        if self.pending:
            end_overdue(self.pending, self.r, self._settle)
            first_come(self.pending)
            goes = {id(t) for t in (*ready, *compiled(arrived, self.r))}
            resend, retrying = self.kept.take(self.pending, goes)  # prefilled already: sent again, not prefilled
            ready, compiling = (
                [t for t in self.pending if id(t) in goes],
                [t for t in self.pending if id(t) not in goes],
            )
            s = self.r.settings
            taken = take_batch(ready, self.running, s.prefill_chunk_size, s.max_prefill_tokens, s.prefill_pass_s)
            self.pending = retrying + ready + compiling
            self.pending[:0] = self.sender.again(resend)  # (Redis failing still: they wait, the others go on)
            if taken:  # (none: the waiting ones wait for room in a step, not for blocks)
                self._guarded(taken, lambda: self._start(taken))
        if self.running:
            self._guarded([t for p in self.running for t in p.tickets], self._step)
        else:
            self.r.stats.set(batch_size=0)  # no batch (not the last one's size for ever)
        if self.handed_off.reclaim():  # after the batch, not before it: off the path of a request that just arrived
            self.starved = False  # blocks came free: the waiting requests try again at once
        if self.room is not None:  # what its blocks cannot hold goes to a peer with room
            kept = self.room.share(self.pending, tokens_of, self.heartbeat, held=self._held())
            self.starved, self.pending = self.starved and len(kept) == len(self.pending), kept
        self.r.stats.set(waiting_requests=len(self.pending))  # (peers read it: room.py)
        self.r.announce(waiting)  # (a round trip every lease / 4) likewise
        self.r.ranks.keepalive()  # idle, or every request waiting for blocks: the other ranks still hear

    def hand_back(self, rerun: Callable[[str, int], bool]) -> None:
        """Stopping, its loop ended (or its step abandoned: what that writes after is stale): each prompt
        it holds (waiting, under way, prefilled with its first token or handoff unsent) is re-run by a live
        peer (``rerun(request, attempt)``, hand_back.py); one handed to decode is decode's, its state kept
        till decode copies it (``KeptHandoffs.wait_taken``), its blocks going with the process."""
        for prefilling in self.running:
            end_failed(prefilling.spans, "handed back: its worker stopped", prefilling.done)
        prompts = [*self.running, *self.stepping]  # (a step abandoned under way: its prompts too, its writes stale)
        late = self.intake.close(lambda ticket: hand_back([ticket], self.heartbeat, rerun))
        held = [*self.pending, *(t for p in prompts for t in p.tickets if not t.done.is_set()), *late]
        self.pending, self.running = [], []
        hand_back({id(t): t for t in held}.values(), self.heartbeat, rerun)
        let_go(self.room)  # (handed to peers before: their messages held, their tasks waited for the grace)

    def _held(self) -> Container[str]:
        """The requests no peer may take: holding blocks here, or with a first token kept unsent."""
        kept = self.kept.requests()
        return {*self.r.pools.sequences, *kept} if kept else self.r.pools.sequences

    def _guarded(self, tickets: list[Ticket[PrefillJob]], work: Callable[[], None]) -> None:
        """Redis failing puts ``tickets`` not settled yet back; another failure ends them."""
        try:
            work()
        except redis.RedisError:
            self._put_back(self._unsettled(tickets))
            raise
        except Exception as exc:  # a failed forward ends its requests, never the loop
            self._fail(self._unsettled(tickets), exc)

    def _fail(self, batch: list[Ticket[PrefillJob]], exc: Exception) -> None:
        log.exception("prefill failed: requests %s fail", ", ".join(t.job.request.request_id for t in batch))
        self.r.stats.fail("prefill")
        for ticket in batch:
            self.r.ranks.release(ticket.job.request.request_id)
            self.kept.drop(ticket)  # (its blocks freed: Redis failing the end leaves nothing kept)
            self._settle(ticket, "error", f"prefill failed: {type(exc).__name__}")

    def _unsettled(self, taken: list[Ticket[PrefillJob]]) -> list[Ticket[PrefillJob]]:
        """The tickets of a batch neither handed on, nor ended, nor waiting for blocks, nor under way."""
        running = {id(t) for p in self.running for t in p.tickets}
        return [t for t in taken if not t.done.is_set() and t not in self.pending and id(t) not in running]

    def _put_back(self, unsettled: list[Ticket[PrefillJob]]) -> None:
        """Redis failed mid-batch: free these requests' blocks (but a prefilled one's) and retry them later."""
        for ticket in (t for t in unsettled if not self.kept.holds(t)):
            self.r.ranks.release(ticket.job.request.request_id)
        runs = {t.job.request.request_id: t.job.attempt for t in unsettled}
        self.heartbeat.hold(list(runs), runs)  # one may be released
        self.pending[:0] = unsettled

    def _end_cancelled(self) -> None:
        """End what a client cancelled, with one read of the marks: the prompts under way whose every
        request it cancelled (their blocks are free before their next chunk, on every rank: rank 0
        tells the others to release them), and the requests waiting for room in a step or for blocks
        (never prefilled)."""
        rids = [t.job.request.request_id for t in (*self.pending, *(t for p in self.running for t in p.tickets))]
        cancelled = self.r.store.cancelled(rids)
        for ended in [p for p in self.running if cancelled.issuperset(p.request_ids)]:
            end_failed(ended.spans, "cancelled", ended.done)
            for ticket in ended.tickets:  # (Redis failing here: tried again at the next iteration)
                self._settle(ticket, "cancelled")
                self.r.ranks.release(ticket.job.request.request_id)
            self.running.remove(ended)
        for ticket in [t for t in self.pending if t.job.request.request_id in cancelled]:
            self._settle(ticket, "cancelled")  # (Redis failing: still pending, ended at the next try)
            self.pending.remove(ticket)

    def _settle(
        self,
        ticket: Ticket[PrefillJob],
        reason: str,
        message: str = "",
        index: int | None = None,
        usage: dict | None = None,
        code: str = "",
        text: str = "",
    ) -> Settled:
        """End a request without handing it to decode (freeing its parked image embeddings, and once
        its end is written, the blocks its kept prefill holds); its stream closes at ``index``
        (default: after the tokens it came with). -> what the settle did (STALE: nothing written)."""
        job, store = ticket.job, self.r.store
        rid = job.request.request_id
        self.heartbeat.release(rid)
        if job.embeddings is not None:
            discard_tensor(job.embeddings, store)
        end = len(job.generated) if index is None else index
        settled = store.settle(rid, job.attempt, self.r.name, reason, end, message, usage, code, text)
        self.kept.drop(ticket)  # (Redis failing: kept, and the end tried again, its token the same)
        ticket.done.set()
        return settled

    def _admit(self, taken: list[Ticket[PrefillJob]]) -> list[Ticket[PrefillJob]]:
        """Reserve the taken requests' blocks, first come first served (waiting.py): one the free blocks
        cannot hold waits in ``pending`` (still leased to this worker) and those after it with it; one
        the pools can never hold is settled. -> those admitted."""
        admitted, full = [], False
        for ticket in taken:
            job, rid = ticket.job, ticket.job.request.request_id
            if full or self.handed_off.holds(rid, job.attempt):  # (held: a duplicate, till they are free)
                self.pending.append(ticket)
                continue
            try:
                self.handed_off.reserve(rid, tokens_of(job))
            except OutOfBlocks as exc:
                if exc.permanent:
                    log.error("request %s: %s", rid, exc)
                    self._settle(ticket, "error", str(exc))
                else:
                    self.pending.append(ticket)
                    full = True
                continue
            admitted.append(ticket)
        return admitted

    def _start(self, taken: list[Ticket[PrefillJob]]) -> None:
        """Admit the taken requests (their blocks) and put their prompts under way, identical ones once."""
        admitted = self._admit(taken)
        self.starved = not admitted and bool(self.pending)
        runs: dict[object, list[Ticket[PrefillJob]]] = {}
        for ticket in admitted:
            runs.setdefault(forward_of(ticket.job) or id(ticket), []).append(ticket)
        inputs = []
        for tickets in runs.values():
            try:
                inputs.append((tickets, batch_input(tickets[0], self.r.store)))
            except LookupError as exc:  # its image embeddings expired or went with a dead host (it runs alone)
                self._embeddings_gone(tickets[0], exc)
        now = clock.now()
        image_token = self.r.model.cfg.raw.get("image_token_id")
        started = [t for tickets, _ in inputs for t in tickets]
        self.r.stats.add(queued_requests=len(started), queue_seconds=sum(now - t.job.request.created for t in started))
        for tickets, item in inputs:
            spans = [forward_span(t.job, len(started)) for t in tickets]
            self.running.append(Prefilling(tickets, item, spans, image_token))

    def _embeddings_gone(self, ticket: Ticket[PrefillJob], exc: LookupError) -> None:
        """Its image embeddings are gone: it fails, unless its run is over (re-run: vision unlinked them)."""
        rid = ticket.job.request.request_id
        if self.heartbeat.over(rid, ticket.job.attempt):  # (was: an ERROR and a failure for a stale run)
            self.handed_off.drop_over(rid)
            return ticket.done.set()
        log.error("request %s: %s", rid, exc)
        self.r.stats.fail("prefill")
        self.r.ranks.release(rid)
        self._settle(ticket, "error", "its images' embeddings are gone (expired or lost with a worker): retry")

    def _step(self) -> None:
        """Prefill the next chunk of the prompts under way the step's plan runs (prefilling.py); emit the
        first token of each that ends and hand it to decode."""
        rows, chunks = plan_step(self.running, self.r.settings.prefill_chunk_size, self.r.settings.max_prefill_tokens)
        self.stepping = rows  # (first: a hand back between the two reads them in one list or both)
        self.running = [p for p in self.running if all(p is not q for q in rows)]  # (a failed forward ends rows)
        self.r.stats.add(steps=1)
        self.r.stats.set(batch_size=len(rows))
        self.r.stats.call("prefill")
        # the leases live until each request is handed on (the heartbeat holds them from their claim):
        # a slow emit of a large batch must not let the last ones lapse (the reaper would re-run a
        # request that is being handed to decode)
        try:
            with self.heartbeat.step():
                logits = self.r.ranks.prefill(chunks)
            ended_at = time.time_ns()  # (bench/overhead.py's hop from the forward's end to the first token's append)
            self.r.stats.add(tokens=sum(len(c.tokens) for c in chunks))
            for p, chunk in zip(rows, chunks, strict=True):
                p.prefilled, p.done = p.prefilled + len(chunk.tokens), p.done + 1
            self.running += [p for p, out in zip(rows, logits, strict=True) if out is None]
            ended = [(p, out) for p, out in zip(rows, logits, strict=True) if out is not None]
            for p, out in ended:  # (each one's state kept first: Redis failing a send spares them all)
                for span in p.spans:
                    span.add_event("forward_ended", timestamp=ended_at)
                self._finish(p, out)
            self.pending[:0] = self.sender.first([p for p, _ in ended])  # (Redis failing: kept, sent again)
        except Exception as exc:  # the forward failed (or Redis, mid-batch): the spans not ended yet end failed
            for p in (p for p in rows if all(p is not q for q in self.running)):  # (not the prompts going on)
                end_failed(p.spans, f"prefill failed: {type(exc).__name__}", p.done)
            raise
        finally:
            self.stepping = []

    def _finish(self, prefilled: Prefilling, logits) -> None:
        """A prompt's last chunk ran: the requests sharing its forward get its state, kept with its
        logits till each one's first token and handoff are out (a re-run's handoff alone: the last token
        it streamed is decode's to feed, ``prefilled_ids``)."""
        source, echo = prefilled.request_ids[0], prefilled.input.echo
        for rid in prefilled.request_ids[1:]:
            self.r.ranks.copy(source, rid)
        for ticket in prefilled.tickets:
            self.kept.keep(ticket, logits, echo.scores if echo else None, streamed=bool(ticket.job.generated))
