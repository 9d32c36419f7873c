"""Answering admitted requests: one SSE stream, or one JSON body with a choice per request
(several prompts, or ``n`` > 1). A client that leaves cancels what it asked for."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from dayzero.serving.messages import GenerationRequest
from dayzero.telemetry import tracer

from .bus import TokenEvent
from .context import Gateway
from .errors import APIError
from .shapes import Shape


async def admit(gw: Gateway, requests: list[GenerationRequest], images: list[bytes], spans: list[trace.Span]) -> None:
    """Queue all of them or none (429 when the stage's queue cannot take them all)."""
    stage = "vision" if images else "prefill"
    if await gw.bus.queue_depth(stage) + len(requests) > gw.settings.max_queued:
        gw.metrics.rejected.inc()
        raise APIError(
            429,
            "too many queued requests; retry shortly",
            "rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    for request, span in zip(requests, spans, strict=True):
        with trace.use_span(span, end_on_exit=False):  # the queued job carries this span's context
            await gw.bus.submit(request, images)


def usage(event: TokenEvent) -> dict:
    u = event.usage or {"prompt_tokens": 0, "completion_tokens": event.index}
    return {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


async def sse(
    gw: Gateway,
    request: GenerationRequest,
    after: str,
    first: bool,
    span: trace.Span | None = None,
    choice: int | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """One request's stream; ``choice``: one of several streams merged (no event ids, no [DONE])."""
    echoed = after != "0-0"  # a resumed stream has echoed its prompt already
    shape = Shape(request, gw.settings.model_name, gw.codec, echoed=echoed, choice=choice or 0)
    rid, finished = request.request_id, False
    last_at, held = None, []  # held: tokens whose text (and logprobs) wait for the next chunk
    await gw.bus.watch(rid)
    try:
        if echoed and request.kind == "chat":
            await _replay(gw, shape, rid, after)
        if first:
            yield ServerSentEvent(data=json.dumps(shape.chunk(None, None, role=True)))
        async for event in gw.bus.events(rid, after):
            if event is None:
                yield ServerSentEvent(comment="keep-alive")
                continue
            now = time.time()
            if last_at is None and event.index == 0:
                gw.metrics.ttft.observe(now - request.created)
            elif last_at is not None:
                gw.metrics.itl.observe(now - last_at)
            last_at = now
            if event.finish_reason == "error":
                finished = True
                yield ServerSentEvent(
                    id=event.entry_id,
                    data=json.dumps({"error": {"message": event.error or "generation failed", "type": "server_error"}}),
                )
                break
            if event.finish_reason:
                finished = True
                gw.metrics.finished.labels(event.finish_reason).inc()
                gw.metrics.e2e.observe(now - request.created)
                chunk = shape.chunk(event.text, event.finish_reason, usage(event), tokens=[*held, event])
                yield ServerSentEvent(id=event.entry_id, data=json.dumps(chunk))
                break
            held.append(event)
            chunk = shape.chunk(event.text, None, tokens=held) if event.text else None
            if chunk is not None:
                yield ServerSentEvent(id=event.entry_id, data=json.dumps(chunk))
                held = []
        if choice is None:
            yield ServerSentEvent(data="[DONE]")
    finally:
        if not finished:
            gw.metrics.disconnects.inc()
        with anyio.CancelScope(shield=True):  # the client is gone: the stream task is being cancelled
            await gw.bus.unwatch(rid, finished)
        if span is not None:
            span.set_attribute("dayzero.finished", finished)
            span.end()


async def _replay(gw: Gateway, shape: Shape, rid: str, after: str) -> None:
    """A resumed chat stream's text up to ``after``, so its split picks up where the client's left off."""
    async for event in gw.bus.events(rid):
        if event is None:
            return
        shape.replay(event.text)
        if event.entry_id == after:
            return


async def _events(gw: Gateway, request: GenerationRequest, http: Request) -> list[TokenEvent]:
    """A request's stream entries up to its last; raises when it fails or the client leaves."""
    rid, events, finished = request.request_id, [], False
    await gw.bus.watch(rid)
    try:
        async for event in gw.bus.events(rid):
            if event is None:
                if await http.is_disconnected():
                    break
                continue
            events.append(event)
            if event.finish_reason:
                finished = True
                if event.finish_reason == "error":
                    raise APIError(500, event.error or "generation failed", "server_error")
                gw.metrics.finished.labels(event.finish_reason).inc()
                gw.metrics.e2e.observe(time.time() - request.created)
                return events
    finally:
        with anyio.CancelScope(shield=True):
            await gw.bus.unwatch(rid, finished)
    raise APIError(499, "client disconnected", code="client_closed")


async def collect(gw: Gateway, requests: list[GenerationRequest], http: Request) -> JSONResponse:
    """One body; choice ``i`` is request ``i``'s completion. One failure cancels the others."""
    results: list[list[TokenEvent]] = [[] for _ in requests]

    async def run(i: int) -> None:
        results[i] = await _events(gw, requests[i], http)

    try:
        async with anyio.create_task_group() as group:
            for i in range(len(requests)):
                group.start_soon(run, i)
    except BaseExceptionGroup as failed:  # the first failure, as the error handlers know it (400s, 503)
        raise failed.exceptions[0] from None
    choices, totals = [], {"prompt_tokens": 0, "completion_tokens": 0}
    prompts = set()
    for i, (request, events) in enumerate(zip(requests, results, strict=True)):
        last = events[-1]
        text = "".join(e.text for e in events)
        body = Shape(request, gw.settings.model_name, gw.codec).body(text, last.finish_reason, usage(last), events)
        choices.append({**body["choices"][0], "index": i})
        totals["completion_tokens"] += body["usage"]["completion_tokens"]
        if request.prompt_ids not in prompts:  # n > 1 counts a prompt once
            prompts.add(request.prompt_ids)
            totals["prompt_tokens"] += body["usage"]["prompt_tokens"]
    body["choices"], body["usage"] = choices, {**totals, "total_tokens": sum(totals.values())}
    return JSONResponse(body, headers={"X-Request-Id": ",".join(r.request_id for r in requests)})


async def respond(
    gw: Gateway, requests: list[GenerationRequest], stream: bool, http: Request, images: list[bytes] = ()
):
    """Submit, then answer: each ``gateway.request`` span covers its request until its stream ends."""
    spans = [
        tracer.start_span(
            "gateway.request",
            attributes={
                "dayzero.request_id": r.request_id,
                "dayzero.prompt_tokens": len(r.prompt_ids),
                "dayzero.images": r.images,
                "dayzero.stream": stream,
            },
        )
        for r in requests
    ]
    try:
        await admit(gw, requests, list(images), spans)
    except Exception:
        for span in spans:
            span.end()
        raise
    if not stream:
        try:
            return await collect(gw, requests, http)
        finally:
            for span in spans:
                span.end()
    if len(requests) == 1:
        events = sse(gw, requests[0], "0-0", first=requests[0].kind == "chat", span=spans[0])
    else:
        events = _merged(gw, requests, spans)
    ids = ",".join(r.request_id for r in requests)
    return EventSourceResponse(events, ping=gw.settings.keepalive_s, headers={"X-Request-Id": ids})


async def _merged(
    gw: Gateway, requests: list[GenerationRequest], spans: list[trace.Span]
) -> AsyncIterator[ServerSentEvent]:
    """Several choices' chunks as they come, each marked with its index; not resumable (no ids).
    Leaving cancels every choice (each stream's own clean-up unwatches its request)."""
    queue: asyncio.Queue[ServerSentEvent | None] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for event in sse(gw, requests[i], "0-0", requests[i].kind == "chat", spans[i], choice=i):
                if event.comment is None:  # keep-alives: the response pings on its own
                    queue.put_nowait(ServerSentEvent(data=event.data))
        finally:
            queue.put_nowait(None)

    pumps = [asyncio.create_task(pump(i)) for i in range(len(requests))]
    try:
        running = len(pumps)
        while running:
            event = await queue.get()
            if event is None:
                running -= 1
            else:
                yield event
        yield ServerSentEvent(data="[DONE]")
    finally:
        for task in pumps:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*pumps, return_exceptions=True)
