"""A client must send each request in time: its head within ``REQUEST_READ_S`` of the connection's
start (or of the previous response's end), its body within as long again plus a second per
``BODY_BYTES_PER_S`` bytes it declares (a chunked body: the most a body may hold); else it gets a
408 and the connection closes. uvicorn times out only idle keep-alive connections, so a peer
trickling a header a byte at a time would hold its socket (and a file descriptor) for ever. An
answer, however long it takes, is not timed, nor a pipelined request while an earlier answer is
still going out (uvicorn stops reading until it is done).

A client must also take its answer: one that reads nothing for ``WRITE_STALL_S`` while the answer
waits to go out (the socket's buffers full) loses the connection, at once (a close would wait for
the buffer to drain, for ever). Its app sees the disconnect: a stream's request is cancelled. A
stream to a client that never reads would otherwise hold its connection, its slot under
DAYZERO_MAX_STREAMS and the tokens queued for it, for ever.

When the server begins to stop, uvicorn closes each connection with no request under way at once,
under a request already on its way (a kept-alive connection's next, a new connection's first): its
client saw a reset, not an answer. Such a connection now takes requests for ``STOP_LINGER_S`` more
(the app answers them 503 ``shutting_down`` and ``Connection: close``: stopping.py), then closes.

A request's head is bounded too: one whose line and headers are over ``MAX_HEAD_BYTES`` gets a
431, and the connection closes; one still coming, once its reads after the one it began in are
over it (its end is not waited for). httptools bounds none (h11, uvicorn's other parser, refuses
a head over 16 KiB): 20 MB sent as 2 million headers in 7 s were taken whole, the gateway's memory
179 -> 475 MB (kept after), its event loop held ~7 s for every other client; one header's value is
gathered by copying it whole at each read (25 MB: 5.3 s of the loop's time; 90 MB in the 30 s a
head has).

Such a refusal (a 408, a 431, a malformed request's 400) comes while the client may still be sending:
closed at once, the connection was reset by the client's next bytes (unread: the kernel answers them
with a reset), and a client still sending saw the reset after the answer or instead of it (RFC 9112
9.6: a reset may erase the answer before the client reads it). The answer is now followed by a
half-close, the client's bytes read and dropped (bounded: ``DRAIN_*``), then the close. A request
refused behind others pipelined on its connection waits for their answers (HTTP/1.1 answers in order),
nothing more read meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dayzero.settings import Settings

from .errors import error_body

REQUEST_READ_S = 30.0
BODY_BYTES_PER_S = 64 << 10  # a slow mobile link: an 8 MiB body gets 30 + 128 s
WRITE_STALL_S = 60.0  # an answer's buffered bytes untaken this long: the client is gone or stalled
STOP_LINGER_S = 0.5  # a connection idle when the server begins to stop waits this long for a request on its way
MAX_HEAD_BYTES = 64 << 10  # a request's line and headers (nginx's default buffers: 32 KiB)
# after a refusal it sends itself, what the client still sends is read and dropped (nginx's lingering
# close): until its end, DRAIN_IDLE_S without a byte, DRAIN_S in all or DRAIN_BYTES, whichever first
DRAIN_IDLE_S, DRAIN_S, DRAIN_BYTES = 1.0, 5.0, 8 << 20


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops there."""


class RequestReadDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request, and on the client
    taking its answer."""

    read_s, body_bytes_per_s, write_stall_s = REQUEST_READ_S, BODY_BYTES_PER_S, WRITE_STALL_S
    stop_linger_s, max_head_bytes = STOP_LINGER_S, MAX_HEAD_BYTES
    max_body_bytes: int = Settings.model_fields["max_request_bytes"].default
    # each error it sends itself, before any route (a 408, a malformed request's 400): the gateway
    # counts them with the routes' (dayzero_request_errors_total); they went uncounted
    error_sent: Callable[[dict], None] = staticmethod(lambda error: None)
    _deadline: asyncio.TimerHandle | None = None
    _stalled: asyncio.TimerHandle | None = None  # armed while the transport's buffer is full
    _lingers: asyncio.TimerHandle | None = None  # the server stops: this idle connection closes then
    _stopping = False  # the server began to stop: a refusal closes at once, no drain holds the stop
    _heard = False  # whether its client sent a byte: a browser's preconnect sends none, and is not counted
    _head_open = _head_began = False  # a request's head is being read; it began in the read at hand
    _head_bytes = 0  # the head's bytes read so far
    _head_over = False  # a whole head was over the bound (``on_headers_complete`` stopped the parse)
    drain_idle_s, drain_s, drain_bytes = DRAIN_IDLE_S, DRAIN_S, DRAIN_BYTES
    _draining: asyncio.TimerHandle | None = None  # refused: the close, once the client's bytes stop
    _drain_ends = 0.0  # (the loop's time)
    _drained = 0  # bytes dropped since the refusal
    _held: tuple[str, dict] | None = None  # a refusal (status, body) waiting for the answers before it

    def data_received(self, data: bytes) -> None:
        if self._held is not None:  # refused, the answers before its own still going out: nothing more is
            self.flow.pause_reading()  # parsed, nor read till then (uvicorn reads on after each answer)
            return
        if self._draining is not None:  # refused: nothing more is parsed
            self._drained += len(data)
            if self._drained > self.drain_bytes:
                self.transport.close()
            else:
                self._drain_on()
            return
        self._heard, self._head_began = True, False
        super().data_received(data)
        if self._head_open and not self._head_began and not self.transport.is_closing():  # all of it head
            self._head_bytes += len(data)  # (a head's first read is not counted: it may end a request before)
            if self._head_bytes > self.max_head_bytes:
                self._refuse_head()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.logger = _UnlessHeadOver(self.logger, self)
        self._arm(self.read_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open, self._head_began, self._head_bytes = True, True, 0

    def on_headers_complete(self) -> None:
        self._head_open = False
        if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > self.max_head_bytes:
            self._head_over = True  # (a head that ended within its reads: as sent, ": " and line ends counted)
            raise _HeadTooLarge  # httptools stops here, and uvicorn calls send_400_response: a 431 then
        super().on_headers_complete()
        declared = next((v for name, v in self.headers if name == b"content-length"), None)
        length = int(declared) if declared is not None and declared.isdigit() else self.max_body_bytes
        self._arm(self.read_s + min(length, self.max_body_bytes) / self.body_bytes_per_s)

    def on_message_complete(self) -> None:
        self._disarm()  # the request is whole: the app answers at its own pace
        super().on_message_complete()

    def on_response_complete(self) -> None:
        last = not self.pipeline  # none waiting its turn: the answer just out was the last before a held refusal
        super().on_response_complete()  # (starts the next request waiting its turn, if any)
        if self.transport.is_closing():
            return
        if self._held is None:
            self._arm(self.read_s)  # the next request on this connection
        elif last:  # (not the last parsed's state: a refused one with its body under way is that, never run)
            self._unset_keepalive_if_required()  # the refusal's turn (uvicorn's idle close would cut its drain)
            self._send_refusal(*self._held)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.write_stall_s, self.transport.abort)

    def resume_writing(self) -> None:
        self._disarm_stall()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_stall()
        if self._draining is not None:
            self._draining.cancel()
        if self._lingers is not None:
            self._lingers.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server begins to stop: uvicorn's, at once for a connection with a request under way (it
        closes after its answer), after ``stop_linger_s`` for one without (a request on its way is answered);
        a refused one closes at once (nothing more is answered on it: its drain held the stop), as one
        refused from now on does."""
        self._stopping = True
        if self._draining is not None:
            self.transport.close()
        elif self.cycle is None or self.cycle.response_complete:
            self._lingers = self.loop.call_later(self.stop_linger_s, super().shutdown)
        else:
            super().shutdown()

    def _disarm_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _reading(self) -> bool:
        """Whether a request is still arriving: a head (no request yet, or the last one answered),
        or a body nothing has been answered to; not while an earlier answer is still going out."""
        cycle = self.cycle
        if self.pipeline:  # requests waiting for their turn: uvicorn reads on once the answer is out
            return False
        if cycle is None or cycle.response_complete:
            return True
        return cycle.more_body and not cycle.response_started

    def send_400_response(self, msg: str) -> None:  # uvicorn's, for what httptools cannot parse
        if self._head_over:
            self._refuse_head()
            return
        self._refuse(
            "400 Bad Request", error_body(f"malformed HTTP request: {msg}", "invalid_request_error", code="bad_http")
        )

    def _too_slow(self) -> None:
        self._deadline = None
        if self._reading() and not self.transport.is_closing():
            self._refuse(
                "408 Request Timeout",
                error_body("the request was not sent in time", "invalid_request_error", code="request_timeout"),
            )

    def _refuse_head(self) -> None:
        message = f"the request line and headers are over {self.max_head_bytes} bytes"
        self._refuse(
            "431 Request Header Fields Too Large",
            error_body(message, "invalid_request_error", code="headers_too_large"),
        )

    def _refuse(self, status: str, body: dict) -> None:
        """Answer ``status`` with the error ``body`` and close the connection, once the requests before
        the refused one are answered (HTTP/1.1 answers in order: a malformed request pipelined behind
        one under way was answered first, in its place, and the earlier answer never went out)."""
        self._disarm()
        cycle = self.cycle  # the refused request's, while its body arrives; else the last one parsed
        own = cycle if cycle is not None and not cycle.response_complete and cycle.more_body else None
        earlier = bool(self.pipeline) or (cycle is not None and cycle is not own and not cycle.response_complete)
        if own is not None:  # its app: the client is gone, as on a close (its send wrote after the end:
            own.disconnected = True  # "Cannot call write() after write_eof()", logged as the app's error)
            own.message_event.set()
            if self.pipeline and self.pipeline[0][0] is own:  # waiting its turn (the last parsed: leftmost)
                self.pipeline.popleft()
        if earlier:
            self._held = (status, body)
            self.flow.pause_reading()
        else:
            self._send_refusal(status, body)

    def _send_refusal(self, status: str, body: dict) -> None:
        """The refusal's answer, then the close; counted where its client sent something (an idle
        connection opened ahead of a request it never made is no error of a client's: each page a
        browser preconnected from counted a 408 after 30 s)."""
        self._held = None
        text = json.dumps(body)
        head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(f"{head}content-length: {len(text)}\r\n\r\n{text}".encode())
        self.flow.resume_reading()  # (paused while its app took no body: the drain reads on)
        if self.transport.can_write_eof() and not self._stopping:  # (a TCP socket's can)
            self.transport.write_eof()  # the answer, then our end: the client's end closes the connection
            self._drain_ends = self.loop.time() + self.drain_s
            self._drain_on()
        else:
            self.transport.close()
        if self._heard:
            self.error_sent(body["error"])

    def _drain_on(self) -> None:
        """(Re)arm the close of a refused connection: ``drain_idle_s`` from now, not past its end."""
        if self._draining is not None:
            self._draining.cancel()
        wait_s = min(self.drain_idle_s, self._drain_ends - self.loop.time())
        self._draining = self.loop.call_later(max(wait_s, 0.0), self.transport.close)


class _UnlessHeadOver:
    """uvicorn's logger for one connection, less its warning for a parse this protocol stopped itself
    (a whole head over the bound, refused 431: "Invalid HTTP request received." said the head was
    malformed; counted in dayzero_request_errors_total, as a head refused before its end is)."""

    def __init__(self, logger: logging.Logger, protocol: RequestReadDeadline) -> None:
        self._logger, self._protocol = logger, protocol

    def __getattr__(self, name: str) -> object:
        return getattr(self._logger, name)

    def warning(self, *args: object, **kwargs: object) -> None:
        if not self._protocol._head_over:
            self._logger.warning(*args, **kwargs)


def request_read_deadline(max_body_bytes: int, error_sent: Callable[[dict], None]) -> type[RequestReadDeadline]:
    """The protocol for a gateway taking bodies of up to ``max_body_bytes``, counting the errors it
    sends with ``error_sent`` (OpenAI's error object)."""
    own = {"max_body_bytes": max_body_bytes, "error_sent": staticmethod(error_sent)}
    return type("RequestReadDeadline", (RequestReadDeadline,), own)
