"""A client must send each request whole in time: its head and body within ``REQUEST_READ_S`` of
the connection's start or of the previous response's end, else it gets a 408 and the connection
closes. uvicorn times out only idle keep-alive connections, so a peer trickling a header a byte
at a time would hold its socket (and a file descriptor) for ever. A response, however long it
streams, is not timed."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import error_body

REQUEST_READ_S = 30.0


def _timed_out(read_s: float) -> bytes:
    message = f"the request was not sent whole within {read_s:g} s"
    body = json.dumps(error_body(message, "invalid_request_error", code="request_timeout")).encode()
    head = "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


class RequestReadDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadline armed while a request is being read."""

    read_s = REQUEST_READ_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()  # the request is whole: the app answers at its own pace
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.read_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.write(_timed_out(self.read_s))
            self.transport.close()
