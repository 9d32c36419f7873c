"""A request's answer as server-sent events: its chunks as tokens arrive (a resumed stream from
where its client left off), several requests' streams merged into one (``n`` > 1, a completions
list), and every end that is not a finish as an error event in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable

import anyio
import redis
from opentelemetry import trace
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from dayzero.serving.messages import GenerationRequest
from dayzero.serving.records import Token

from .context import Gateway
from .outcome import Progress, Usage, closing, stream_error
from .shapes import Shape
from .subscription import Subscription, entry_order

# A keep-alive is a comment line with no blank line after it: the next event's own blank line ends
# both. A comment followed by a blank line is an empty event to the official openai client once an
# event id was seen (it keeps last_event_id), and it then fails parsing "" as JSON mid-stream.
# The same for the reconnect delay: a ``retry:`` line that rides on the first event (alone, with its
# own blank line, that client would read it as an empty event too).
KEEP_ALIVE = b": keep-alive\n"


def retry_line(ms: int) -> bytes:
    return f"retry: {ms}\n".encode()


SHUTDOWN_GRACE_S = 2.0  # open streams get this long to send their error event when the server stops


async def sse(
    gw: Gateway,
    request: GenerationRequest,
    after: str,
    span: trace.Span | None = None,
    merged: bool = False,
    shutdown: anyio.Event | None = None,
    used: Usage | None = None,
    counted: bool = True,
    watcher: str | None = None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    """One request's stream; ``merged``: one of several streams merged (no event ids, no usage
    chunk, no [DONE]; its finish is added to ``used``); ``watcher``: this read, watched at the
    request's admission (None: a read of its own, watched as it begins). Every end but a finish (a failure, a cancel,
    Redis lost, shutdown) sends an error event in OpenAI's error shape (merged: with the ``index``
    of the choice it ends, as in ``choices[].index``); a single stream then ends
    with ``[DONE]`` either way, after a finish with the usage chunk when the client asked for it.
    A stream read again by its id is not ``counted`` in the latency and finish metrics. One this
    gateway ended because Redis failed its read (lost, frozen, its stream refused) told its client so
    (``queue_unavailable``, retry): nobody resumes it, its request is cancelled as soon as Redis takes
    the cancel (it generated on for the disconnect grace, then 7 s more for a leave Redis had failed)."""
    progress, left, lost = Progress(gw, request, span, counted=counted), True, False
    if watcher is not None:
        progress.watcher = watcher
    if not merged and request.usage_in_stream:
        used = Usage()
    try:
        gw.bus.leaving.reading(request.request_id)  # (its cancels pending: this read's leave decides)
        if not merged:
            yield retry_line(gw.settings.sse_retry_ms)
        try:
            if watcher is None:
                await gw.bus.leaving.watch(request.request_id, progress.watcher, request.created)
            async with gw.bus.hub.subscribe(request.request_id, after) as sub, closing(sub, shutdown):
                async for event in _chunks(gw, request, sub, after, progress, used):
                    yield event
            if not merged and used is not None:
                yield _usage_event(gw, request, used)
        except Exception as exc:  # every failure becomes the stream's error event
            lost = isinstance(exc, redis.RedisError)
            error = stream_error(exc, request.request_id)
            progress.end("error", error["error"]["message"])  # unless the failure was the request's own, as seen
            gw.metrics.error_sent(error["error"])
            if merged:  # which choice it ends (the others go on)
                error["error"]["index"] = request.choice
            yield ServerSentEvent(data=json.dumps(error))
        left = False
        if not merged:
            yield ServerSentEvent(data="[DONE]")
    finally:
        if left and progress.counted:  # (a stream read again: its choice is counted by its own stream)
            gw.metrics.disconnects.inc()
        gw.bus.leaving.leave(request.request_id, progress.watcher, request.created, progress.over, not lost)
        if span is not None:
            span.set_attribute("dayzero.finished", progress.over)
            span.end()


def _usage_event(gw: Gateway, request: GenerationRequest, used: Usage) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(Shape(request, gw.settings.model_name, gw.codec, gw.fingerprint).usage_chunk(used))
    )


async def _chunks(
    gw: Gateway,
    request: GenerationRequest,
    sub: Subscription,
    after: str,
    progress: Progress,
    used: Usage | None,
) -> AsyncIterator[ServerSentEvent | bytes]:
    """The chunks of one stream up to its last (a resumed stream has echoed its prompt already);
    its finish counts in ``used``."""
    resumed = after != "0-0"
    if resumed and await _over_by(gw, request, after, progress, used):
        return
    shape = Shape(request, gw.settings.model_name, gw.codec, gw.fingerprint)
    if resumed:
        await _replay(gw, shape, request.request_id, after)
    elif request.kind == "chat":
        yield ServerSentEvent(data=json.dumps(shape.chunk(None, None, role=True)))
    held: list[Token] = []  # tokens whose text (and logprobs) wait for the next chunk
    while True:
        event = await sub.next(gw.settings.keepalive_s)
        if event is None:
            if resumed and await _over_by(gw, request, after, progress, used):
                return
            yield KEEP_ALIVE
            continue
        # what its tokens held back, and a chat's parser (a "<" that may open a tag), read before the error
        if event.finish_reason == "error" and (event.text or request.kind == "chat"):
            chunk = shape.chunk(event.text, None, tokens=held, cut=True)
            if chunk is not None:
                yield ServerSentEvent(id=event.entry_id, data=json.dumps(chunk))
        progress.see(event)
        if event.finish_reason:
            chunk = shape.chunk(event.text, event.finish_reason, tokens=[*held, event])
            yield ServerSentEvent(id=event.entry_id, data=json.dumps(chunk))
            if used is not None:
                used.add(request, event)
            return
        arrived = [event, *sub.pending()]  # more than one when this gateway lags: one chunk for all
        for later in arrived[1:]:
            progress.see(later)
        held += arrived
        text = "".join(token.text for token in arrived)
        # no text: held until some comes (a token of a character's first bytes), unless there is
        # no tokenizer, whose answers are the ids themselves
        chunk = shape.chunk(text, None, tokens=held) if text or not gw.codec.has_tokenizer else None
        if chunk is not None:  # None: the text is held (inside a tool call, a tag cut midway)
            yield ServerSentEvent(id=arrived[-1].entry_id, data=json.dumps(chunk))
            held = []


async def _over_by(gw: Gateway, request: GenerationRequest, after: str, progress: Progress, used: Usage | None) -> bool:
    """Whether a resumed stream ended at or before ``after`` (a client that missed only the usage
    chunk or ``[DONE]``): its failure raises, its finish counts in ``used``."""
    end = await gw.bus.hub.finish_by(request.request_id, after)
    if end is None:
        return False
    if end.finish_reason in ("error", "cancelled"):
        progress.see(end)  # raises the stream's error
    progress.over = True
    if used is not None:
        used.add(request, end)
    return True


async def _replay(gw: Gateway, shape: Shape, rid: str, after: str) -> None:
    """A resumed stream's tokens up to ``after``, so its chat split (reasoning, content, tool calls)
    or its completion's text offsets pick up where the client's left off."""
    async with gw.bus.hub.subscribe(rid) as sub:
        while (event := await sub.next(gw.settings.keepalive_s)) is not None:
            shape.replay(event)
            if entry_order(event.entry_id) >= entry_order(after):
                return


class _EventStream(EventSourceResponse):
    """sse-starlette's response, and ``never_began`` once it ends if its stream never began: its
    client gone (or the server stopping) before the first event, sse-starlette cancels the stream at
    its first step (its disconnect listener runs while the stream waits for its send lock), and the
    stream's own code (watch, leave, a resume's arrival ended) never ran."""

    def __init__(self, events: AsyncIterator, never_began: Callable[[], None], **options) -> None:
        super().__init__(self._began(events), **options)
        self.began, self.never_began = False, never_began

    async def _began(self, events: AsyncIterator) -> AsyncIterator:
        self.began = True
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.began:
                self.never_began()


def _left_unread(
    gw: Gateway, requests: list[GenerationRequest], spans: list, watchers: list[str | None]
) -> Callable[[], None]:
    """Leaves ``requests`` as a read that began and ended at once (by its ``watchers``: the reads
    admission watched; None, one never watched): a resume's arrival ends (it held their cancels),
    each is cancelled after the grace unless read again (was: a resume's held its request's cancels
    for ARRIVAL_S, a new stream's was never cancelled)."""

    def leave() -> None:
        for request, span, watcher in zip(requests, spans, watchers, strict=True):
            gw.bus.leaving.reading(request.request_id)
            gw.bus.leaving.leave(request.request_id, watcher or uuid.uuid4().hex, request.created, finished=False)
            if span is not None:
                span.end()

    return leave


def event_stream(
    gw: Gateway,
    requests: list[GenerationRequest],
    after: str,
    headers: dict[str, str],
    spans: list | None = None,
    counted: bool = True,
    watchers: list[str] | None = None,
) -> EventSourceResponse:
    """The SSE response of one request (resumable from ``after``) or of several merged; one read
    again by its id is not ``counted`` in the metrics (its latencies are the replay's); ``watchers``:
    the reads admission watched, one per request (None: a read watched as it begins)."""
    shutdown = anyio.Event()  # set by sse-starlette when the server begins to shut down
    spans, watchers = spans or [None] * len(requests), watchers or [None] * len(requests)
    if len(requests) == 1:
        events = sse(gw, requests[0], after, spans[0], shutdown=shutdown, counted=counted, watcher=watchers[0])
    else:
        events = _merged(gw, requests, spans, watchers, shutdown)
    return _EventStream(
        events,
        _left_unread(gw, requests, spans, watchers),
        ping=gw.settings.keepalive_s,
        ping_message_factory=lambda: KEEP_ALIVE,
        headers=headers,
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


async def _merged(
    gw: Gateway, requests: list[GenerationRequest], spans: list, watchers: list[str | None], shutdown: anyio.Event
) -> AsyncIterator[ServerSentEvent]:
    """Several choices' chunks as they come, each marked with its index; not resumable (no ids).
    When every choice finished, one usage chunk (if asked for) totals them. Leaving cancels every
    choice (each stream's own clean-up unwatches its request), through a cancel scope: delivered
    again until the choice ends (a Task.cancel() lost in a redis-py command left it generating)."""
    queue: asyncio.Queue[ServerSentEvent | None] = asyncio.Queue()
    used = Usage()
    stops = [anyio.CancelScope() for _ in requests]

    async def pump(i: int) -> None:
        with stops[i]:
            try:
                choice = sse(gw, requests[i], "0-0", spans[i], True, shutdown, used, watcher=watchers[i])
                async for event in choice:
                    if isinstance(event, ServerSentEvent) and event.data is not None:  # the response pings itself
                        queue.put_nowait(ServerSentEvent(data=event.data))
            finally:
                queue.put_nowait(None)

    pumps = [asyncio.create_task(pump(i)) for i in range(len(requests))]
    try:
        yield retry_line(gw.settings.sse_retry_ms)
        running = len(pumps)
        while running:
            event = await queue.get()
            if event is None:
                running -= 1
            else:
                yield event
        if requests[0].usage_in_stream and used.choices == len(requests):
            yield _usage_event(gw, requests[0], used)
        yield ServerSentEvent(data="[DONE]")
    finally:
        for stop in stops:
            stop.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*pumps, return_exceptions=True)
