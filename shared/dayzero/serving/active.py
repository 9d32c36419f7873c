"""One request in the decode batch: its state imported at admission, its completion (sampling,
stop rules, text) and its ``decode.generate`` span, from admission to its end."""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry import trace

from ..completion import Completion
from ..config import ModelConfig
from ..telemetry import continued, tracer
from .handoff import Receiver
from .intake import Ticket
from .messages import DecodeJob
from .runtime import Runtime


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
    r.stats.add(queued_requests=1, queue_seconds=time.time() - job.request.created)


@dataclass
class Active:
    ticket: Ticket[DecodeJob]
    completion: Completion
    next_token: int
    span: trace.Span
    first_seen: bool = False

    @classmethod
    def start(cls, runtime: Runtime, ticket: Ticket[DecodeJob], limit: int) -> Active:
        """The imported request's completion, rebuilt from the tokens already streamed (raises
        when its own sampling cannot be set up: a grammar refused)."""
        job = ticket.job
        completion = runtime.completion(job.request, job.generated, limit)
        with continued(job.request.trace):
            attributes = {
                "dayzero.request_id": job.request.request_id,
                "dayzero.prompt_tokens": len(job.request.prompt_ids),
                "dayzero.images": job.request.images,
            }
            span = tracer.start_span("decode.generate", attributes=attributes)
        return cls(ticket, completion, job.generated[-1], span)

    def end_span(self, reason: str, cfg: ModelConfig, length: int, message: str = "") -> None:
        """The span's last event and counts: tokens, and the CSA entries its last query could read;
        a failure (``reason`` error) sets its status, with ``message``."""
        entries = length // cfg.compress_rates["compressed_sparse_attention"]
        if reason == "error":
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        self.span.add_event("finish", {"finish_reason": reason, "completion_tokens": self.completion.count})
        self.span.set_attribute("dayzero.completion_tokens", self.completion.count)
        self.span.set_attribute("dayzero.csa_selected_entries", min(cfg.index_topk, entries))
        self.span.set_attribute("dayzero.csa_entries", entries)
        self.span.end()
