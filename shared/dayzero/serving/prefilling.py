"""Prompts under way in the prefill loop, a chunk prefilled per step, and each step's plan: the
waiting requests it takes beside them, and the chunk each prompt runs in it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from opentelemetry import trace

from ..guided import GRAMMAR_FAILED
from ..telemetry import continued, tracer
from . import redis_clock as clock
from .intake import Ticket
from .lifecycle import Lifecycle
from .messages import PrefillJob
from .parked import take_tensor
from .prefill_batch import BatchInput, echo_of, forward_of, prefilled_ids


@dataclass(slots=True)
class Prefilling:
    """``tickets``: the requests sharing the forward (identical inputs), each with its ``prefill.forward``
    span; the first one's sequence runs, the others get a copy of its state after its input's last
    chunk. Each step prefills the next chunk of ``input`` its plan gives it (``plan_step``)."""

    tickets: list[Ticket[PrefillJob]]
    input: BatchInput
    spans: list[trace.Span]
    image_token: int | None = None  # (a chunk takes the patches of its own placeholders)
    prefilled: int = 0  # tokens
    done: int = 0  # steps that ran a chunk of it

    @property
    def left(self) -> int:
        return len(self.input.tokens) - self.prefilled

    def next(self, size: int) -> BatchInput:
        return self.input.cut(self.prefilled, self.prefilled + size, self.image_token)

    @property
    def request_ids(self) -> list[str]:
        return [t.job.request.request_id for t in self.tickets]


def tokens_of(job: PrefillJob) -> int:
    """What a request prefills and its blocks hold (``prefilled_ids``)."""
    return len(prefilled_ids(job))


def batch_input(ticket: Ticket[PrefillJob], store: Lifecycle) -> BatchInput:
    """A prompt's input: its tokens, its parked image embeddings (taken once, as it first starts: a
    start again after Redis failed mid-batch has the ticket's), its echo."""
    job = ticket.job
    rid, prompt = job.request.request_id, list(job.request.prompt_ids)
    if job.embeddings is not None and ticket.images is None:
        ticket.images = take_tensor(job.embeddings, store)
    return BatchInput(rid, list(prefilled_ids(job)), ticket.images, echo_of(job), len(prompt))


def forward_span(job: PrefillJob, batch: int) -> trace.Span:
    """The request's ``prefill.forward`` span, from its first chunk to its handoff (``batch``: the
    requests that started with it)."""
    with continued(job.request.trace):
        return tracer.start_span(
            "prefill.forward",
            attributes={
                "dayzero.request_id": job.request.request_id,
                "dayzero.batch_size": batch,
                "dayzero.prompt_tokens": len(job.request.prompt_ids),
                "dayzero.streamed_tokens": len(job.generated),  # a re-run's: after its prompt (the last fed by decode)
                "dayzero.images": job.request.images,
                "dayzero.attempt": job.attempt,
            },
        )


def end_failed(spans: list[trace.Span], message: str, chunks: int) -> None:
    """End the spans not ended yet as failed, after ``chunks`` chunks prefilled."""
    for span in (s for s in spans if s.is_recording()):
        span.set_attribute("dayzero.prefilled_chunks", chunks)
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        span.end()


def mark_failed(span: trace.Span, message: str, code: str) -> None:
    """Mark ``span`` (a worker's, of a request ending in error) with its failure: ERROR with
    ``message``, but for its schema's (``GRAMMAR_FAILED``: the client's error, a 400, as the gateway
    answers it), an event (an operator's trace of ERRORs held every client's unsatisfiable schema)."""
    if code == GRAMMAR_FAILED:
        span.add_event(GRAMMAR_FAILED, {"message": message})
    else:
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))


def newcomers_room(chunk_size: int, max_tokens: int) -> int:
    """The tokens of a step that prompts longer than a chunk leave to shorter ones while some wait
    (new arrivals, mostly): a chunk, or half the step when a chunk is more than that."""
    return min(chunk_size, max_tokens // 2)


def _long(tokens: int, chunk_size: int) -> bool:
    """A prompt longer than a chunk: it runs for several steps, a chunk at most in each."""
    return tokens > chunk_size


def take_batch(
    pending: list[Ticket[PrefillJob]],
    running: list[Prefilling],
    chunk_size: int,
    max_tokens: int,
    pass_s: float = math.inf,
    now: float | None = None,
) -> list[Ticket[PrefillJob]]:
    """The waiting requests (taken out of ``pending``, in order) whose first chunks have room in the
    next step (``plan_step``) beside the prompts under way, up to ``max_tokens``
    (DAYZERO_MAX_PREFILL_TOKENS); a prompt the batch runs already counted once (an ``n`` > 1
    request's choices share its forward). Prompts of at most a chunk start while the long ones under
    way leave them any room (``newcomers_room`` at least: a long one's chunk shrinks for them), the
    first chunk of one that does not fit cut to what is left; a long one starts with a whole chunk
    beside them, while the long ones under way stay within ``max_tokens`` less that room together
    (a long one waits for room, in its turn; the first one always starts). The shorter ones under way
    keep a long one waiting only ``pass_s`` after its admission (DAYZERO_PREFILL_PASS_S; ``now``:
    unix time): past it, it starts beside them, and from the next step on it has its share of every
    step, as a long one under way (a stream of short prompts, each taking the room the last one
    left, kept it waiting for ever)."""
    floor = max_tokens - newcomers_room(chunk_size, max_tokens)  # what long prompts under way keep
    longs = sum(min(chunk_size, p.left) for p in running if _long(len(p.input.tokens), chunk_size))
    shorts = sum(p.left for p in running if not _long(len(p.input.tokens), chunk_size))
    batch, kept, runs = [], [], set()
    for ticket in pending:
        job = ticket.job
        run, length = forward_of(job), tokens_of(job)
        if run is not None and run in runs:
            fits = True  # (its forward is in the batch)
        elif _long(length, chunk_size):
            room = longs + chunk_size <= max_tokens - shorts or _waited(job, pass_s, now)
            fits = room and (not longs or longs + chunk_size <= floor)
            longs += chunk_size if fits else 0
        else:
            fits = shorts < max_tokens - min(longs, floor)
            shorts += length if fits else 0
        if fits:
            batch.append(ticket)
            runs.add(run)
        else:
            kept.append(ticket)
    pending[:] = kept
    return batch


def _waited(job: PrefillJob, pass_s: float, now: float | None) -> bool:
    """Admitted ``pass_s`` or longer before ``now`` (default: the time now)."""
    return job.request.created <= (clock.now() if now is None else now) - pass_s


def plan_step(running: list[Prefilling], chunk_size: int, max_tokens: int) -> tuple[list[Prefilling], list[BatchInput]]:
    """The next step: the prompts under way that run in it and the next chunk of each, ``max_tokens``
    in all. Prompts of at most a chunk go first, in order (one whose first chunk was cut before those
    arrived after it), in what the long ones leave them: all they need, up to ``newcomers_room`` of
    the step; the long ones, oldest first, take the rest, a chunk each at most, the last one cut to
    what is left (a prompt left no room waits for the next step). The chunks' boundaries change
    nothing of the maths: ``prefill_step`` continues each sequence where its last chunk ended."""
    longs = [p for p in running if _long(len(p.input.tokens), chunk_size)]
    floor = max_tokens - newcomers_room(chunk_size, max_tokens)
    room = max_tokens - min(sum(min(chunk_size, p.left) for p in longs), floor)
    sizes: dict[int, int] = {}
    for p in (p for p in running if not _long(len(p.input.tokens), chunk_size)):
        sizes[id(p)] = min(p.left, room)
        room -= sizes[id(p)]
    room = max_tokens - sum(sizes.values())
    for p in longs:
        sizes[id(p)] = min(chunk_size, p.left, room)
        room -= sizes[id(p)]
    rows = [p for p in running if sizes[id(p)]]
    return rows, [p.next(sizes[id(p)]) for p in rows]
