"""The decode stage's continuous-batching loop: one token per active request per step.

Admission copies a request's attention state from prefill (then releases prefill's lease),
reserves blocks for the whole completion, and rebuilds the completion from the tokens
already streamed. Each step checks cancel marks, decodes the batch, appends each token to its
request's stream (tokens whose append raised go again, first, with the next append; their
request steps no further meanwhile) and heartbeats the requests' leases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from ..completion import next_steps
from ..config import context_limit
from ..guided import failed_alone, failure
from ..speculative import Acceptance, Speculation, decode_round
from .active import Active
from .decode_admission import admit
from .decode_stats import record_step
from .hand_back import hand_back
from .handoff import Receiver
from .intake import Intake, Ticket, run_loop
from .lease import Heartbeat
from .messages import DecodeJob
from .room import Arrivals, Room, let_go
from .runtime import Runtime
from .stream_scripts import Settled
from .time_limit import overdue
from .waiting import end_overdue

log = logging.getLogger("dayzero.decode")


class DecodeLoop:
    def __init__(self, runtime: Runtime, room: Room | None = None) -> None:
        self.r, self.room = runtime, room  # room: what it cannot hold goes to a peer with room (room.py)
        self.intake: Intake[DecodeJob] = Intake(  # claimed as they arrive; the handoff stays till imported
            lambda ticket: self.heartbeat.claim(
                ticket, self._cancelled_on_arrival, handed_off=True, parked=ticket.job.state.transport == "redis"
            )
        )
        self.waiting: list[Ticket[DecodeJob]] = []
        self.active: dict[str, Active] = {}
        self.receiver = Receiver(runtime.store)
        self.stop = threading.Event()
        self.handed_back = False  # stopping, its requests went to live peers (``hand_back``)
        self.limit = context_limit(runtime.model.cfg, runtime.settings.max_context)
        k = runtime.settings.speculative_tokens
        self.speculation, self.acceptance = (Speculation(k) if k else None), Acceptance()
        self._last_beat = 0.0
        self.arrivals = Arrivals(runtime.pools.layout)  # admitted since the last beat (peers read them: room.py)
        self._marked: set[str] = set()  # cancel marks read with the last step's tokens or a take ...
        self._marks_read: set[str] = set()  # ... and whose they are
        # beats during a step: one longer than the lease (a first call compiling kernels, a huge
        # batch) would let the leases lapse, and the reaper would re-run requests being generated;
        # one past the group timeout is hung (as a silent rank would be): its leases lapse, and so is
        # the loop blocked that long between steps (the worker stamps no liveness: liveness.py)
        # (a claimed state waiting in Redis lives with its lease, from the first such claim on: prefill's
        # DAYZERO_HANDOFF picks the transport, not this worker's; an imported one is taken)
        settings, hung_s = runtime.settings, runtime.settings.group_timeout_s
        self.heartbeat = Heartbeat(runtime.store, runtime.name, settings.lease_s, self.stop, hung_s, hung_s)

    def run_forever(self) -> None:
        run_loop(self.stop, self._iteration, log, self.heartbeat.moved)

    def _iteration(self) -> None:
        idle = not self.active and not self.waiting
        self.waiting.extend(self.intake.drain(0.05 if idle else 0))
        admit(self)
        if self.room is not None:
            self.room.consume(busy=bool(self.active))
        self._cancel()
        if self.active:
            try:
                with self.heartbeat.holding(list(self.active)):
                    self._step()
            except redis.RedisError:
                raise
            except Exception as exc:  # a failed step ends the batch's requests, never the loop
                if not self.handed_back:  # (else the stop's abandoned step, its batch handed back under it)
                    self._fail(exc)
        else:  # no batch: the step gauges say so (not the last step's size and rate for ever)
            self.r.stats.set(batch_size=0, tokens_per_s=0.0)
        self._beat()
        self.r.ranks.keepalive()  # only when the group has heard nothing for a while
        if self.waiting and not self.active:
            self.stop.wait(0.05)  # waiting for blocks or a handoff

    def _beat(self) -> None:
        """Lease heartbeats, worker liveness and the requests' time limit, a few times per lease
        period (not every step)."""
        now = time.monotonic()
        if now - self._last_beat >= self.r.settings.lease_s / 4:
            self._last_beat = now
            runs = {rid: active.ticket.job.attempt for rid, active in self.active.items()}
            for rid in self.r.store.heartbeat(list(runs), self.r.name, self.r.settings.lease_s, runs):
                self._drop(rid)
            self._end_overdue()
            if self.room is not None:
                self.waiting = self.room.hand_back(self.waiting, self._tokens, self.heartbeat)
            self.r.stats.set(waiting_requests=len(self.waiting), **self.arrivals.gauges())
            self.r.announce(len(self.active) or 1)

    def hand_back(self, rerun: Callable[[str, int], bool]) -> None:
        """Stopping, its loop ended (or its step abandoned: what that writes after is stale): each request
        it holds goes to a live peer (hand_back.py). A generating one is re-run from the tokens streamed
        (``rerun(request, attempt)``), a waiting handoff goes back to decode's queue's front (``Room.push``:
        its state kept in prefill's blocks; else re-run too). Its blocks go with the process."""
        # (first, at once: an abandoned step that ends meanwhile reads an emptied batch, never the one walked here)
        self.handed_back, batch, self.active = True, list(self.active.values()), {}
        for active in batch:
            active.span.add_event("handed_back", {"completion_tokens": active.completion.count})
            active.span.end()
        push = self.room.push if self.room is not None else None
        late = self.intake.close(lambda ticket: hand_back([ticket], self.heartbeat, rerun, push))
        waiting, self.waiting = [*self.waiting, *late], []
        hand_back([a.ticket for a in batch], self.heartbeat, rerun)
        hand_back(waiting, self.heartbeat, rerun, push)
        let_go(self.room)  # (handed back before: messages held)

    def _end_overdue(self) -> None:
        """A request admitted longer ago than ``task_time_limit_s`` ends as a token limit would
        (finish reason "length", its text kept, that held back too: ``Completion.end``; its usage
        counted): an error would lose a non-streamed answer's text and make OpenAI's clients run it
        all again. One waiting for blocks ends alike, with the tokens it has streamed (waiting.py)."""
        limit_s = self.r.settings.task_time_limit_s
        for rid in [rid for rid, a in self.active.items() if overdue(a.ticket.job.request.created, limit_s)]:
            log.warning("request %s: past DAYZERO_TASK_TIME_LIMIT_S; ending it", rid)
            completion = self.active[rid].completion
            text, stopped = completion.end()
            reason, usage = "stop" if stopped else "length", completion.usage()
            self._finish(rid, reason, index=self.active[rid].streamed, usage=usage, text=text)
        end_overdue(self.waiting, self.r, self._settle)

    def _drop(self, rid: str) -> None:
        """Stop generating a request whose lease this worker lost (it stalled past the lease and the
        reaper re-runs it elsewhere, or Redis lost its data): free its blocks, settle nothing."""
        log.warning("request %s: lease lost; dropping it", rid)
        self.heartbeat.release(rid)
        active = self.active.pop(rid)
        self.r.ranks.release(rid)
        active.span.add_event("lease_lost", {"completion_tokens": active.completion.count})
        active.span.end()
        active.ticket.done.set()

    def _cancelled_on_arrival(self, ticket: Ticket[DecodeJob]) -> None:
        self._settle(ticket, "cancelled", index=len(ticket.job.generated))

    def _settle(
        self,
        ticket: Ticket[DecodeJob],
        reason: str,
        message: str = "",
        index: int | None = None,
        usage: dict | None = None,
        code: str = "",
        text: str = "",
    ) -> Settled:
        rid, attempt = ticket.job.request.request_id, ticket.job.attempt
        self.heartbeat.release(rid)
        settled = self.r.store.settle(rid, attempt, self.r.name, reason, index, message, usage, code, text)
        ticket.done.set()
        return settled

    def _tokens(self, job: DecodeJob) -> int:
        """What a request reserves: its prompt and whole completion, within the context limit."""
        return min(self.limit, len(job.request.prompt_ids) + job.request.sampling.max_tokens)

    def _finish(self, rid: str, reason: str, index: int | None = None, message: str = "", **end: dict | str) -> None:
        """End active request ``rid`` (``end``: its ``usage``, its error's ``code``, held ``text``); an "error" end
        with no ``message`` is its own sampling's failure's (``Active.end``), which is logged, and counted
        once this worker writes its end, cancelled meanwhile or not: not where its run was re-run
        meanwhile (the settle STALE: the re-run's end is the one written, and counted)."""
        self.heartbeat.release(rid)  # no beat in flight outlives its end
        active = self.active.pop(rid)
        failed = active.end[1] if active.end is not None else None
        if failed is not None and reason == "error" and not message:
            message, code = failure(failed, "sampling failed")
            end = {**end, "code": code}
        active.end_span(reason, self.r.model.cfg, self.r.pools.length(rid), message, str(end.get("code", "")))
        self.r.ranks.release(rid)
        settled = self._settle(active.ticket, reason, message, index=index, **end)
        if failed is not None:
            failed_alone(self.r.stats, rid, failed, "sampling failed", counted=bool(settled))

    def _cancel(self) -> None:
        """Act on the cancel marks of every active and waiting request: read with the last step's
        tokens, and in one round trip for the requests that came since (or all, after no step)."""
        waiting = {t.job.request.request_id: t for t in self.waiting}
        unread = [rid for rid in (*self.active, *waiting) if rid not in self._marks_read]
        marked, self._marked, self._marks_read = self._marked | self.r.store.cancelled(unread), set(), set()
        for rid in marked:
            if rid in self.active:
                self._finish(rid, "cancelled", index=self.active[rid].streamed)
            elif rid in waiting:
                self.waiting.remove(waiting[rid])
                self._settle(waiting[rid], "cancelled", index=len(waiting[rid].job.generated))

    def _fail(self, exc: Exception) -> None:
        """A failed step ends every active request with an error, after the text its streamed tokens
        held back (a character cut short as U+FFFD, a stop string's start), as its own sampling's
        failure ends: its client read the text before the error. Tokens past its stream (unsent, or
        sampled by the failed step) are given up, and the text is as its stream's tokens end it
        (``Active.failed_text``)."""
        log.exception("decode step failed: requests %s fail", ", ".join(self.active))
        self.r.stats.call("decode", failed=True)
        message = f"decode failed: {type(exc).__name__}"
        for rid, active in list(self.active.items()):
            self._finish(rid, "error", index=active.streamed, message=message, text=active.failed_text())

    def _step(self) -> None:
        """Decode the requests that step (the others wait for their tokens' append, or their end),
        then append every request's unsent tokens."""
        for active in self.active.values():  # (a row whose grammar's lexer filled: on a fresh compile, once ready)
            active.mark_stream()
            active.resume(self.r, len(self.active))
        ids = [rid for rid, active in self.active.items() if active.stepping]
        if ids:
            self._decode(ids)
        elif not any(active.unsent for active in self.active.values()):
            self.stop.wait(0.01)  # every row waits for a compile: the loop polls, not spins
        self._append()

    def _decode(self, ids: list[str]) -> None:
        """One step of ``ids``: each request's tokens (one, or a speculative round's) queued for its stream."""
        tokens = [self.active[rid].next_token for rid in ids]
        start = time.perf_counter()
        completions = [self.active[rid].completion for rid in ids]
        if self.speculation is None:  # every rank of the group runs the step; this one samples
            rounds, acceptance = [[s] for s in next_steps(completions, self.r.ranks.decode(ids, tokens))], Acceptance()
        else:
            model, pools, options = self.r.model, self.r.pools, self.r.options
            rounds, acceptance = decode_round(model, pools, ids, tokens, completions, self.speculation, options)
        for rid, steps in zip(ids, rounds, strict=True):  # (queued first: a failure after is no gap in a stream)
            self.active[rid].queue(steps, len(ids))
        record_step(self.r, ids, sum(len(steps) for steps in rounds), time.perf_counter() - start)
        if self.speculation is not None:
            self.acceptance.merge(acceptance)
            self.r.stats.add(**acceptance.counters())
            self.r.stats.set(**self.acceptance.gauges())

    def _append(self) -> None:
        """Append every request's unsent tokens, in order, and read the cancel marks: one round trip
        for the whole batch. One that raises (Redis refusing or lost for a moment) leaves them unsent
        for the next (a replay of any that landed after all is skipped): no gap, so no re-run; their
        requests step no further meanwhile, and those a step ended are settled only once it lands."""
        out = [token for active in self.active.values() for token in active.unsent]
        watch = [*self.active, *(t.job.request.request_id for t in self.waiting)]
        runs = {rid: active.ticket.job.attempt for rid, active in self.active.items()}
        appended = self.r.store.append(out, runs, self.r.name, watch)
        self._marked, self._marks_read = appended.cancelled, set(watch)
        for rid in appended.refused:  # re-run elsewhere while this worker stalled, or a token of its lost: dropped
            self._drop(rid)
        for rid in appended.cancelled & self.active.keys():  # cancelled during the step: none of its tokens written
            self._finish(rid, "cancelled", index=self.active[rid].streamed)
        for active in self.active.values():
            active.unsent.clear()  # on their streams
        for rid, (reason, failed) in [(rid, a.end) for rid, a in self.active.items() if a.end is not None]:
            if failed is None:
                self._finish(rid, reason)  # (its last token carried the finish)
                continue
            # its own sampling's failure (its grammar's: the client reads the text before the error,
            # which ends with what its tokens held back, a character cut short as U+FFFD)
            completion = self.active[rid].completion
            self._finish(rid, "error", index=completion.count, text=completion.end()[0])
