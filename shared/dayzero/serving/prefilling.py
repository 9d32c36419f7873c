"""Prompts under way in the prefill loop, a chunk prefilled per step, and the waiting requests the
next step takes beside them."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace

from ..telemetry import continued, tracer
from .handoff import take_tensor
from .intake import Ticket
from .lifecycle import Lifecycle
from .messages import PrefillJob
from .prefill_batch import BatchInput, echo_of, forward_of


@dataclass(slots=True)
class Prefilling:
    """``tickets``: the requests sharing the forward (identical inputs), each with its ``prefill.forward``
    span; the first one's sequence runs, the others get a copy of its state after the last chunk."""

    tickets: list[Ticket[PrefillJob]]
    chunks: list[BatchInput]
    spans: list[trace.Span]
    done: int = 0  # chunks prefilled

    @property
    def next(self) -> BatchInput:
        return self.chunks[self.done]

    @property
    def request_ids(self) -> list[str]:
        return [t.job.request.request_id for t in self.tickets]


def tokens_of(job: PrefillJob) -> int:
    """A prompt's tokens, and those a re-run streamed already: what it prefills and its blocks hold."""
    return len(job.request.prompt_ids) + len(job.generated)


def batch_input(job: PrefillJob, store: Lifecycle) -> BatchInput:
    """A prompt's input: its tokens, its parked image embeddings (taken once: it starts), its echo."""
    rid, prompt = job.request.request_id, list(job.request.prompt_ids)
    images = take_tensor(job.embeddings, store) if job.embeddings is not None else None
    return BatchInput(rid, [*prompt, *job.generated], images, echo_of(job), len(prompt))


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
                "dayzero.streamed_tokens": len(job.generated),  # a re-run's: prefilled after its prompt
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


def take_batch(
    pending: list[Ticket[PrefillJob]], running: list[Prefilling], chunk_size: int, max_tokens: int
) -> list[Ticket[PrefillJob]]:
    """The waiting requests (taken out of ``pending``, in order) whose first chunks fit the next step
    beside the next chunks of the prompts under way, up to ``max_tokens`` (DAYZERO_MAX_PREFILL_TOKENS);
    a prompt the batch runs already counted once (an ``n`` > 1 request's choices share its forward).
    Prompts longer than a chunk (they go on for more steps) take ``max_tokens - chunk_size`` at most
    together, once one is under way: every step has room for a newly arrived prompt's first chunk,
    so no request waits for a long one to end (a long one waits for room, in its turn)."""
    tokens = lasting = sum(len(p.next.tokens) for p in running)  # (every prompt under way is a long one)
    batch, kept, runs = [], [], set()
    for ticket in pending:
        job = ticket.job
        run, length = forward_of(job), tokens_of(job)
        size = 0 if run is not None and run in runs else min(chunk_size, length)
        long = size if length > chunk_size else 0
        crowded = long and lasting and lasting + long > max_tokens - chunk_size
        if (batch or running) and (tokens + size > max_tokens or crowded):
            kept.append(ticket)
            continue
        batch.append(ticket)
        tokens, lasting = tokens + size, lasting + long
        runs.add(run)
    pending[:] = kept
    return batch
