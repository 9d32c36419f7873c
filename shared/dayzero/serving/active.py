"""One request in the decode batch: its completion (sampling, stop rules, text) and its
``decode.generate`` span, from admission to its end."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace

from ..completion import Completion
from ..config import ModelConfig
from ..telemetry import continued, tracer
from .intake import Ticket
from .messages import DecodeJob
from .runtime import Runtime


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
