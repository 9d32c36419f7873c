"""One request in the decode batch: its state imported at admission, its completion (sampling,
stop rules, text), the tokens a step gave it that are not on its stream yet, and its
``decode.generate`` span, from admission to its end."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from opentelemetry import trace

from ..completion import Completion, Step
from ..config import ModelConfig
from ..guided import LexerFilled
from ..telemetry import continued, tracer
from . import redis_clock as clock
from .handoff import Receiver
from .intake import Ticket
from .messages import DecodeJob
from .prefilling import mark_failed
from .records import Token
from .runtime import Runtime

log = logging.getLogger("dayzero.decode")


def admit_state(runtime: Runtime, receiver: Receiver, job: DecodeJob, total: int) -> None:
    """Copy the prefilled state into the worker's pools and reserve ``total`` tokens for the request
    (``decode.admit`` > ``kv.import``)."""
    rid, r = job.request.request_id, runtime
    with (
        continued(job.request.trace),
        tracer.start_as_current_span("decode.admit", attributes={"dayzero.request_id": rid}),
    ):
        with tracer.start_as_current_span("kv.import", attributes={"dayzero.transport": job.state.transport}):
            start = time.perf_counter()
            receiver.receive(job.state, r.pools, rid)
            r.ranks.adopt(rid)  # the other ranks of the group import the same state
            r.stats.add(handoff_seconds=time.perf_counter() - start, handoff_bytes=r.pools.sequence_bytes(rid))
        r.ranks.reserve(rid, total)
    r.stats.add(queued_requests=1, queue_seconds=clock.now() - job.request.created)


@dataclass
class Active:
    ticket: Ticket[DecodeJob]
    completion: Completion
    next_token: int
    span: trace.Span
    first_seen: bool = False
    # its tokens not on its stream yet, in order: the step's, until its append lands (one that raised,
    # Redis lost or refusing for a moment, leaves them here for the next append to send first)
    unsent: list[Token] = field(default_factory=list)
    # (reason, failure) once a step ended it: its last token's finish reason (no failure), or "error"
    # and what failed its own sampling; it is settled once its tokens are on its stream, never stepped
    # again (its failure logged and counted as this worker ends it: ``DecodeLoop._finish``)
    end: tuple[str, Exception | None] | None = None
    # its tokens queued for its stream (on it or unsent): the completion holds more where a step
    # failed between its sampling and its queue (a speculative round's commit or MTP catch-up)
    queued: int = field(init=False)
    # its completion's text state where its stream ends (``Completion.text_mark``), taken as each step
    # begins while no token of its waits for an append: a failure gives up the tokens past it
    at_stream: tuple[tuple, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.queued = self.completion.count  # (those it came with: on its stream)
        self.at_stream = self.completion.text_mark()

    @classmethod
    def start(cls, runtime: Runtime, ticket: Ticket[DecodeJob], limit: int) -> Active:
        """The imported request's completion, rebuilt from the tokens already streamed (raises
        when its own sampling cannot be set up: a grammar refused)."""
        job = ticket.job
        completion = runtime.completion(ticket, job.generated, limit)
        with continued(job.request.trace):
            attributes = {
                "dayzero.request_id": job.request.request_id,
                "dayzero.prompt_tokens": len(job.request.prompt_ids),
                "dayzero.images": job.request.images,
            }
            span = tracer.start_span("decode.generate", attributes=attributes)
        return cls(ticket, completion, job.generated[-1], span)

    @property
    def streamed(self) -> int:
        """Its tokens on its stream: where an end that gives up the others (unsent, or sampled and
        never queued) closes it (no gap)."""
        return self.queued - len(self.unsent)

    def mark_stream(self) -> None:
        """Take ``at_stream`` as a step begins (its tokens are all on its stream, or wait still for
        the append of an earlier step's, which the mark before that step ends at)."""
        if not self.unsent:
            self.at_stream = self.completion.text_mark()

    def failed_text(self) -> str:
        """The text its streamed tokens held back, at a failure that gives up the rest (unsent, or
        sampled and never queued): ``Completion.end`` where its stream ends."""
        if self.streamed < self.completion.count:
            return self.completion.end_at(self.at_stream)[0]
        return self.completion.end()[0]

    @property
    def stepping(self) -> bool:
        """The next step decodes it: not ended, no token of its waiting for an append (so at most one
        step's tokens wait in memory however long Redis refuses them), its grammar waiting for no
        fresh compile."""
        return self.end is None and not self.unsent and not self.completion.waiting

    def resume(self, runtime: Runtime, batch: int) -> None:
        """Queue the step its full lexer held (if one is) once a fresh compile of its grammar is ready
        (compiled off the loop: the batch steps on meanwhile, this row out of it), on the compile its
        ticket holds (``Runtime.grammar_ready``, as prefill's first token); a row whose replay at
        admission filled its lexer holds no step: it steps again."""
        if self.end is not None or not self.completion.waiting or not runtime.grammar_ready(self.ticket):
            return
        try:
            step = self.completion.resume(self.ticket.grammar)
        except Exception as exc:  # noqa: BLE001 - its grammar failed on the fresh compile too: it fails alone
            step = exc
        if step is not None:
            self.queue([step], batch)

    def queue(self, steps: list[Step | Exception], batch: int) -> None:
        """Queue this step's tokens (``steps``: its own, a sampling failure last) for its stream, and
        its end when one of them ends it (a finish reason, or its sampling failed: it fails alone)."""
        rid = self.ticket.job.request.request_id
        first = self.completion.count - sum(isinstance(s, Step) for s in steps)
        for index, step in enumerate(steps, first):
            if isinstance(step, LexerFilled):
                log.info("request %s: its grammar's lexer is full; waiting for a fresh compile", rid)
                return
            if isinstance(step, Exception):
                self.end = ("error", step)
                return
            usage = self.completion.usage() if step.finish_reason else None  # (the step is its last token)
            self.unsent.append(Token.of(rid, index, step, usage))
            self.queued = index + 1
            if not self.first_seen:
                self.span.add_event("first_token", {"index": index, "batch_size": batch})
                self.first_seen = True
            self.next_token = step.token
            if step.finish_reason:
                self.end = (step.finish_reason, None)
                return

    def end_span(self, reason: str, cfg: ModelConfig, length: int, message: str = "", code: str = "") -> None:
        """The span's last event and counts: tokens, and the CSA entries its last query could read;
        a failure (``reason`` error) marks it, with ``message`` (and its error's ``code``: ``mark_failed``)."""
        entries = length // cfg.compress_rates["compressed_sparse_attention"]
        if reason == "error":
            mark_failed(self.span, message, code)
        self.span.add_event("finish", {"finish_reason": reason, "completion_tokens": self.completion.count})
        self.span.set_attribute("dayzero.completion_tokens", self.completion.count)
        self.span.set_attribute("dayzero.csa_selected_entries", min(cfg.index_topk, entries))
        self.span.set_attribute("dayzero.csa_entries", entries)
        self.span.end()
