"""Answering admitted requests: one SSE stream (``event_streams``: several merged for several
prompts or ``n`` > 1), or one JSON body (``bodies``). A client that leaves cancels what it asked for."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from opentelemetry import trace
from sse_starlette.sse import EventSourceResponse

from dayzero.serving.messages import GenerationRequest
from dayzero.telemetry import continued, tracer

from .access import credential
from .bodies import collect
from .context import Gateway
from .errors import APIError
from .event_streams import event_stream
from .outcome import refuse_unbounded, refuse_unserved


async def admit(
    gw: Gateway,
    requests: list[GenerationRequest],
    images: list[bytes],
    spans: list[trace.Span],
    owner: str,
    watchers: list[str],
) -> None:
    """Queue all of them or none (429 when the stage's queue cannot take them all now; 400 when it
    never could: a retry would be refused the same way for ever), each marked read by its watcher."""
    bounds = (("DAYZERO_MAX_QUEUED", gw.settings.max_queued), ("DAYZERO_MAX_STREAMS", gw.settings.max_streams))
    several = len(requests) > len({r.prompt_index for r in requests})  # n > 1 (else a list of prompts)
    for variable, bound in bounds:
        if len(requests) > bound:
            raise APIError(
                400,
                f"this request runs {len(requests)} generations (n, times the prompts of a completions list); "
                f"this server takes at most {bound} at once ({variable})",
                param="n" if several else "prompt",
            )
    if gw.bus.hub.open + len(requests) > gw.settings.max_streams:
        _refuse(gw, "too many open streams; retry shortly", "too_many_streams")
    refuse_unbounded(gw)
    await refuse_unserved(gw, bool(images))
    sent = time.time_ns()  # (a worker may start the task before the submit returns: stamped at its send)
    if not await gw.bus.submit(requests, spans, images, owner, watchers):
        _refuse(gw, "too many queued requests; retry shortly", "queue_full")
    for span in spans:
        span.add_event("queued", timestamp=sent)


def _refuse(gw: Gateway, message: str, code: str) -> None:
    gw.metrics.rejected.inc()
    raise APIError(429, message, "rate_limit_error", code=code, headers={"Retry-After": "1"})


async def respond(
    gw: Gateway, requests: list[GenerationRequest], stream: bool, http: Request, images: list[bytes] = ()
):
    """Submit, then answer: each ``gateway.request`` span covers its request until its stream ends.
    The answer's read of each request is marked as its reader at admission (one round trip less)."""
    spans = [
        tracer.start_span(
            "gateway.request",
            attributes={
                "dayzero.request_id": r.request_id,
                "dayzero.model": gw.settings.model_name,
                "dayzero.prompt_tokens": len(r.prompt_ids),
                "dayzero.images": r.images,
                "dayzero.stream": stream,
            },
        )
        for r in requests
    ]
    owner, headers = credential(gw, http, stream)
    headers["X-Request-Id"] = ",".join(r.request_id for r in requests)
    watchers = [uuid.uuid4().hex for _ in requests]
    try:
        await admit(gw, requests, list(images), spans, owner, watchers)
    except Exception:
        for span in spans:
            span.end()
        raise
    if not stream:
        try:
            return await collect(gw, requests, spans, http, headers, watchers)
        finally:
            for span in spans:
                span.end()
    return event_stream(gw, requests, "0-0", headers, spans, watchers=watchers)


def resumed(gw: Gateway, request: GenerationRequest, after: str, headers: dict[str, str]) -> EventSourceResponse:
    """A stream read again from ``after`` (not counted in the metrics): its ``gateway.resume`` span
    joins the request's trace, under its ``gateway.request`` span, linked to this read's HTTP span."""
    link = trace.Link(trace.get_current_span().get_span_context())
    with continued(request.trace):
        attributes = {"dayzero.request_id": request.request_id, "dayzero.after": after}
        span = tracer.start_span("gateway.resume", links=[link], attributes=attributes)
    return event_stream(gw, [request], after, headers, [span], counted=False)
