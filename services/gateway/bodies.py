"""Answering admitted requests without streaming: one JSON body with a choice per request (several
prompts, or ``n`` > 1). A client that leaves before its body is ready cancels what it asked for, at
once (a client that times out and retries would otherwise have its copies decode side by side)."""

from __future__ import annotations

import asyncio

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse
from opentelemetry import trace

from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token

from .context import Gateway
from .errors import APIError
from .outcome import Progress, Usage, usage
from .shapes import Shape
from .stopping import server_stopping, shutting_down
from .subscription import Closed

PRESENCE_CHECK_S = 0.5  # how often a waiting body checks that its client is still connected
CLIENT_CLOSED = 499  # nginx's status for a request whose client left before the answer


async def _events(gw: Gateway, progress: Progress) -> list[Token]:
    """A request's stream entries up to its last (its read watched at admission); raises when it fails."""
    request, events = progress.request, []
    try:
        async with gw.bus.hub.subscribe(request.request_id) as sub:
            while True:
                event = await sub.next(gw.settings.keepalive_s)
                if event is None:
                    continue
                progress.see(event)
                events.append(event)
                if event.finish_reason:
                    return events
    except Exception as exc:
        progress.end("error", str(exc) or type(exc).__name__)  # unless the failure was the request's own, as seen
        if isinstance(exc, Closed):
            raise shutting_down() from None
        raise
    finally:
        gw.bus.leaving.leave(request.request_id, progress.watcher, request.created, progress.over, resumable=False)


async def _client_present(http: Request) -> None:
    """Raises once the client has gone (its requests are then cancelled: nobody can resume them) or
    the server begins to stop (answer now, not when cut off); checked while tokens flow too."""
    while True:
        await asyncio.sleep(PRESENCE_CHECK_S)
        if server_stopping():
            raise shutting_down()
        if await http.is_disconnected():
            raise APIError(CLIENT_CLOSED, "client disconnected", code="client_closed")


async def collect(
    gw: Gateway,
    requests: list[GenerationRequest],
    spans: list[trace.Span],
    http: Request,
    headers: dict[str, str],
    watchers: list[str],
) -> JSONResponse:
    """One body; choice ``i`` is request ``i``'s completion (``spans[i]`` its span, ``watchers[i]``
    its read, watched at admission). One failure cancels the others."""
    results: list[list[Token]] = [[] for _ in requests]
    progress = [
        Progress(gw, request, span, watcher=watcher)
        for request, span, watcher in zip(requests, spans, watchers, strict=True)
    ]
    left = len(requests)

    async def run(i: int) -> None:
        nonlocal left
        results[i] = await _events(gw, progress[i])
        left -= 1
        if left == 0:  # all done: stop watching the client
            group.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_client_present, http)
            for i in range(len(requests)):
                group.start_soon(run, i)
    except BaseExceptionGroup as failed:  # the first failure, as the error handlers know it (400s, 503)
        first = failed.exceptions[0]
        for cut in progress:  # the choices it cut short: the client left, as from a stream, or an error
            if isinstance(first, APIError) and first.status == CLIENT_CLOSED and not cut.ended:
                gw.metrics.disconnects.inc()
            else:
                cut.end("error", str(first))
        raise first from None
    choices, used = [], Usage()
    for request, events in zip(requests, results, strict=True):
        last = events[-1]
        text = "".join(e.text for e in events)
        shape = Shape(request, gw.settings.model_name, gw.codec, gw.fingerprint)
        body = shape.body(text, last.finish_reason, usage(request, last), events)
        choices.append(body["choices"][0])
        used.add(request, last)
    body["choices"], body["usage"] = choices, used.body()
    return JSONResponse(body, headers=headers)
