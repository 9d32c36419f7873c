"""A gateway that begins to stop (SIGTERM) answers what it will not serve with 503 ``shutting_down``,
``Retry-After`` and ``Connection: close``, never a dropped connection: a request that arrives then
(on a connection kept alive, or one uvicorn accepted just before it stopped accepting), and one
whose body is still arriving (uvicorn cancelled it at the end of its shutdown grace and answered
500). Such a body is read on for up to half the grace first: its answer then goes out over a
connection with nothing unread, which closes cleanly (closed under a client still sending, it was
reset and the client lost the answer: 1 in 25 slow bodies in bench/gateway_stop.py). Requests
already admitted end as before: a body with this 503 (bodies.py), a stream with an error event of
that code (event_streams.py). The health, readiness and metrics routes answer to the end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sse_starlette.sse import AppStatus
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError, error_response

ANSWERED_TO_THE_END = ("/health", "/ready", "/metrics")
STOP_POLL_S = 0.1  # how often a body still arriving looks whether the server began to stop (uvicorn's tick)


def shutting_down() -> APIError:
    message = "the server is shutting down; retry"
    headers = {"Retry-After": "1", "Connection": "close"}  # (the client's retry goes to a new connection)
    return APIError(503, message, "service_unavailable", code="shutting_down", headers=headers)


def server_stopping() -> bool:
    """uvicorn received its SIGTERM (sse-starlette's flag, which ends the open streams)."""
    return AppStatus.should_exit


class _Stopped(Exception):
    """The server began to stop while a request's body was still arriving."""


class Stopping:
    """Plain ASGI, outside BodyLimit (which reads each body whole before the app runs); a body still
    arriving when the server stops is read on for up to ``drain_s`` before its 503."""

    def __init__(self, app: ASGIApp, drain_s: float, stopping: Callable[[], bool] = server_stopping) -> None:
        self.app, self.drain_s, self.stopping = app, drain_s, stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ANSWERED_TO_THE_END:
            await self.app(scope, receive, send)
            return
        arrived = False  # the body has arrived whole (or the client left)

        async def received() -> Message:
            nonlocal arrived
            message = await (receive() if arrived else self._unless_stopping(receive))
            arrived = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        try:
            if self.stopping():
                raise _Stopped
            await self.app(scope, received, send)
        except _Stopped:
            if not arrived:
                await self._drained(receive)
            refused = shutting_down()
            answer = error_response(refused.status, refused.message, refused.type, None, refused.code, refused.headers)
            await answer(scope, receive, send)

    async def _unless_stopping(self, receive: Receive) -> Message:
        """The next part of a body; raises _Stopped once the server begins to stop first. (uvicorn's
        receive, cut while it waits, keeps what arrived for the next call. A timeout needs no turn of
        the event loop, a task beside the receive did: ~85 us a request against ~270, load 25 here.)"""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_POLL_S):
                    return await receive()
            if self.stopping():
                raise _Stopped

    async def _drained(self, receive: Receive) -> None:
        """The rest of a body read and dropped, for up to ``drain_s`` (then its connection closes
        under the rest)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_s):
                while (message := await receive())["type"] == "http.request" and message.get("more_body"):
                    pass
