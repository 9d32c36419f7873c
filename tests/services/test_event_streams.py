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

    async def choice(gw, request, after, span, merged, shutdown, used):
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
        merged = event_streams._merged(gw, [0, 1], [None, None], anyio.Event())
        await merged.__anext__()  # the retry line: the response has begun
        await anyio.sleep(0.01)  # each choice's reader is in its first command
        await merged.aclose()  # the client left

    monkeypatch.setattr(event_streams, "sse", choice)
    asyncio.run(leave_at_once())
    assert ended == {0: "stopped", 1: "stopped"}
