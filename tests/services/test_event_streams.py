"""Streamed responses of several choices: a client that leaves stops every choice."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import anyio
from sse_starlette.sse import ServerSentEvent

from services.gateway import event_streams


def test_a_choice_whose_first_command_loses_the_cancel_still_stops_when_the_client_leaves(monkeypatch):
    """An n = 2 stream left at once: each choice's reader was stopped by one Task.cancel(), which
    redis-py 8.2's asyncio client loses when it comes during a command (24 of 28 cancels that came
    mid-command, on a script call like the stream's first, its watch). That choice read on, its
    request generating to max_tokens with nobody reading, and the response waited for it to end.
    Here each choice's first await swallows the cancel as that command does: both must still stop."""
    ended: dict[int, str] = {}

    async def choice(gw, request, after, span, merged, shutdown, used, watcher):
        with contextlib.suppress(asyncio.CancelledError):  # lost, as redis-py loses it
            await anyio.sleep(0.05)  # the stream's first command
        try:
            for _ in range(50):  # tokens keep coming
                await anyio.sleep(0.01)
                yield ServerSentEvent(data=f"{request}")
            ended[request] = "generated to its end"
        except BaseException:
            ended[request] = "stopped"
            raise

    async def leave_at_once() -> None:
        gw = SimpleNamespace(settings=SimpleNamespace(sse_retry_ms=1000))
        merged = event_streams._merged(gw, [0, 1], [None, None], [None, None], anyio.Event())
        await merged.__anext__()  # the retry line: the response has begun
        await anyio.sleep(0.01)  # each choice's reader is in its first command
        await merged.aclose()  # the client left

    monkeypatch.setattr(event_streams, "sse", choice)
    asyncio.run(leave_at_once())
    assert ended == {0: "stopped", 1: "stopped"}


class _Leaving:
    """What a stream's end tells the gateway's Leaving, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.watchers: list[str] = []

    def reading(self, request_id: str) -> None:
        self.calls.append(("reading", request_id))

    def leave(self, request_id: str, watcher: str, created: float, finished: bool) -> None:
        self.calls.append(("leave", request_id))
        self.watchers.append(watcher)


def test_a_stream_that_never_began_leaves_its_request(monkeypatch):
    """The response's first send waits (its transport paused: a client that reads nothing) and the
    client leaves meanwhile: sse-starlette cancels the stream before its first step, so the stream's
    own code never ran. A resume so ended held its request's cancels for 30 s (its arrival ends when
    its stream begins), a new stream was never cancelled (nothing watched it, nothing left it). Now
    the response leaves it as a read that began and ended at once."""
    began = []

    async def stream(gw, request, after, span, shutdown, counted, watcher):
        began.append(request.request_id)
        yield b"retry: 1000\n"

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def paused_send(message: dict) -> None:
        await anyio.sleep(0.05)  # (the first send: the response's head, waiting for the transport)

    leaving = _Leaving()
    gw = SimpleNamespace(settings=SimpleNamespace(keepalive_s=10.0), bus=SimpleNamespace(leaving=leaving))
    request = SimpleNamespace(request_id="r1", created=0.0)
    monkeypatch.setattr(event_streams, "sse", stream)
    response = event_streams.event_stream(gw, [request], "1-0", {}, counted=False)
    asyncio.run(response({"type": "http", "method": "GET"}, receive, paused_send))
    assert began == [] and leaving.calls == [("reading", "r1"), ("leave", "r1")]  # (was: [], nothing left)


def test_a_new_stream_that_never_began_leaves_as_the_read_its_admission_watched(monkeypatch):
    """Admission marks the response's read among the stream's readers (its watcher); a response
    that never began must leave as that read: left as another, the first stays in the readers' set
    and the request, read by nobody, is never cancelled (Redis's cancel waits for an empty set)."""

    async def stream(gw, request, after, span, shutdown, counted, watcher):
        yield b"retry: 1000\n"

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def paused_send(message: dict) -> None:
        await anyio.sleep(0.05)

    leaving = _Leaving()
    gw = SimpleNamespace(settings=SimpleNamespace(keepalive_s=10.0), bus=SimpleNamespace(leaving=leaving))
    requests = [SimpleNamespace(request_id=f"r{i}", created=0.0) for i in range(2)]
    monkeypatch.setattr(event_streams, "sse", stream)
    for chosen in (requests[:1], requests):  # one stream, and several merged
        leaving.watchers.clear()
        watchers = [f"read-{r.request_id}" for r in chosen]
        response = event_streams.event_stream(gw, chosen, "0-0", {}, watchers=watchers)
        asyncio.run(response({"type": "http", "method": "GET"}, receive, paused_send))
        assert leaving.watchers == watchers
