"""A request the connection refuses itself (a head over its bound: 431; a malformed one: 400) while
its client is still sending: the client reads the answer and the connection's end, not a reset; what
the client sends after the refusal is read and dropped for a bounded time and number of bytes (a real
uvicorn server on a real socket)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import pytest

from services.gateway.deadline import RequestReadDeadline

from .protocol_server import serving

DRAIN_IDLE_S, DRAIN_S, DRAIN_BYTES = 0.3, 1.5, 256 << 10


class _Quick(RequestReadDeadline):
    read_s, max_head_bytes, max_body_bytes = 5.0, 1024, 2000
    drain_idle_s, drain_s, drain_bytes = DRAIN_IDLE_S, DRAIN_S, DRAIN_BYTES


RAISED_LATE: list[str] = []  # the errors the sends of /late's answers raised


async def _answer(scope, receive, send) -> None:
    if scope["path"] == "/late":  # answered without its body being read (as GET /health), a moment on
        await asyncio.sleep(0.05)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
        except RuntimeError as exc:
            RAISED_LATE.append(repr(exc))
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server():
    with serving(_answer, _Quick) as port:
        yield port


REFUSED = {  # a request the connection refuses before its end, and its code
    "head over the bound": (b"POST / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4096 + b"\r\n", "headers_too_large"),
    "malformed": (b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "bad_http"),
}


def _refused_sending(port: int, first: bytes, more: bytes, chunk: int, pause_s: float) -> tuple[bytes, str, float]:
    """Sends ``first``, then ``more`` in ``chunk``-byte writes ``pause_s`` apart, while reading: what
    was read, how the reading ended (``eof``, or the error's name), and the seconds from the answer
    to the sending's failure (the connection closed; inf: all was sent)."""
    failed_at = float("inf")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:

        def send() -> None:
            nonlocal failed_at
            try:
                s.sendall(first)
                for i in range(0, len(more), chunk):
                    s.sendall(more[i : i + chunk])
                    time.sleep(pause_s)
            except OSError:
                failed_at = time.monotonic()

        sender = threading.Thread(target=send)
        sender.start()
        received, ended, answered = b"", "eof", None
        try:
            while data := s.recv(65536):
                received += data
                answered = answered or time.monotonic()
        except OSError as exc:
            ended = type(exc).__name__
        sender.join(30)
    return received, ended, failed_at - (answered or failed_at)


@pytest.mark.parametrize("case", REFUSED)
def test_a_client_still_sending_reads_the_refusal_and_a_clean_end(server, case):
    """Closed at once, the connection was reset by the client's next bytes: 16-20 of 20 such clients
    saw the answer and then a reset (a reset may erase an answer not yet read: RFC 9112 9.6)."""
    first, code = REFUSED[case]
    for _ in range(5):
        received, ended, lasted = _refused_sending(server, first, b"x" * (128 << 10), 16384, 0)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0] in (b"HTTP/1.1 431 Request Header Fields Too Large", b"HTTP/1.1 400 Bad Request")
        assert json.loads(body)["error"]["code"] == code, received
        assert ended == "eof" and lasted == float("inf"), (ended, lasted)  # (all 128 KiB sent)


def test_the_drain_ends_past_its_bytes(server):
    """A client sending without pause is cut once past DRAIN_BYTES, before DRAIN_S."""
    first, _ = REFUSED["head over the bound"]
    received, ended, lasted = _refused_sending(server, first, b"x" * (64 * DRAIN_BYTES), 16384, 0)
    assert received.startswith(b"HTTP/1.1 431"), received
    assert lasted < DRAIN_S, (ended, lasted)


def test_the_drain_ends_past_its_time(server):
    """A client trickling bytes (each within DRAIN_IDLE_S of the last, never DRAIN_BYTES) is cut at
    DRAIN_S (its send after the close is answered with a reset; the one after that fails)."""
    first, _ = REFUSED["head over the bound"]
    received, ended, lasted = _refused_sending(server, first, b"x" * 10_000, 100, DRAIN_IDLE_S / 3)
    assert received.startswith(b"HTTP/1.1 431"), received
    assert DRAIN_S - 0.2 < lasted < DRAIN_S + 2, (ended, lasted)


def test_a_request_refused_while_its_app_answers_is_gone_for_the_app(server):
    """The app of a request under way when the connection refused it (a 400 for its body) answered
    during the drain: its send raised "Cannot call write() after write_eof()", logged with its traceback
    as an exception of the app (the gateway's CatchAll logged it as an internal error, and its 500
    raised again). It is now told its client is gone, as it was when the refusal closed the connection
    at once."""
    RAISED_LATE.clear()
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(b"GET /late HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        received = b""
        while data := s.recv(65536):
            received += data
        time.sleep(DRAIN_IDLE_S + 0.3)  # (the client keeps its end open: the drain ends at its idle bound)
    assert received.startswith(b"HTTP/1.1 400 Bad Request") and received.count(b"HTTP/1.1") == 1, received
    assert RAISED_LATE == [], RAISED_LATE  # (its sends return: nothing is sent)


PIPELINED = {  # what follows a request answered a moment on (GET /late) in the same write: the answers
    "a malformed request": (b"BAD REQUEST\r\n\r\n", [b"200", b"400"]),
    "a request, then a malformed one": (b"GET / HTTP/1.1\r\nhost: x\r\n\r\nBAD\r\n\r\n", [b"200", b"200", b"400"]),
    "a request with a malformed body": (REFUSED["malformed"][0], [b"200", b"400"]),
    "a request, then one with a malformed body": (
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n" + REFUSED["malformed"][0],
        [b"200", b"200", b"400"],
    ),
    "a head over the bound": (b"GET / HTTP/1.1\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n", [b"200", b"431"]),
}


@pytest.mark.parametrize("case", PIPELINED)
def test_requests_pipelined_before_a_refused_one_are_answered_first(server, case):
    """HTTP/1.1 answers a connection's requests in order. A request refused while one before it was
    still being answered got its 400 (or 431) at once, in the earlier one's place (the client read it
    as that request's answer), and the earlier answer never went out (its app's send raised, the
    transport closed). The refusal now waits for the answers before it, then closes as before: its
    client still sending reads them all and a clean end."""
    RAISED_LATE.clear()
    after, statuses = PIPELINED[case]
    first = b"GET /late HTTP/1.1\r\nhost: x\r\n\r\n" + after
    received, ended, lasted = _refused_sending(server, first, b"x" * (128 << 10), 16384, 0)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == statuses, received
    assert received.endswith(b"}") and received.count(b"\r\n\r\nok") == len(statuses) - 1, received
    assert ended == "eof" and lasted == float("inf"), (ended, lasted)  # (all 128 KiB sent)
    assert RAISED_LATE == [], RAISED_LATE


def _trickle(s: socket.socket, stopping: threading.Event) -> None:
    """A byte at a time on ``s``, each within the drain's idle bound, till ``stopping`` or a failed send."""
    try:
        while not stopping.is_set():
            s.sendall(b"x")
            time.sleep(DRAIN_IDLE_S / 3)
    except OSError:
        pass


def test_a_server_stopping_closes_a_draining_connection_at_once():
    """A refused connection whose request was under way (its body malformed) held the server's stop
    until its drain ended (a client trickling bytes: DRAIN_S, 5 s at the gateway's bounds; the stop
    waits for every connection). Nothing more is answered on it: it closes as the stop begins."""

    class _Long(_Quick):
        drain_s = 8.0

    stopping = threading.Event()
    with socket.socket() as s:
        with serving(_answer, _Long) as port:
            s.connect(("127.0.0.1", port))
            s.sendall(REFUSED["malformed"][0])
            assert s.recv(65536).startswith(b"HTTP/1.1 400"), "refused"
            threading.Thread(target=_trickle, args=(s, stopping), daemon=True).start()
            time.sleep(DRAIN_IDLE_S * 2)  # draining, past its idle bound: the trickle keeps it open
            began = time.monotonic()
        stopped_s = time.monotonic() - began  # (the block's end stops the server and waits for it)
        stopping.set()
    assert stopped_s < _Long.drain_s / 2, stopped_s  # (~0.2 s; it was ~8)


async def _busy(scope, receive, send) -> None:
    await asyncio.sleep(2.5)  # takes none of its body for now (busy elsewhere): uvicorn stops reading


def test_a_request_refused_while_its_body_waits_for_its_app_is_drained_too():
    """A body the app takes none of fills uvicorn's buffer, which stops the reading: a 408 then began
    a drain that read nothing, and closed DRAIN_IDLE_S later on the client's unread bytes, a reset (its
    next send failed: BrokenPipeError). The refusal reads on."""

    class _Hasty(_Quick):
        read_s = 0.5

    first = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n" + b"x" * (128 << 10)
    with serving(_busy, _Hasty) as port:
        received, ended, lasted = _refused_sending(port, first, b"x" * (64 << 10), 4096, 0.1)
    assert received.startswith(b"HTTP/1.1 408"), received
    assert ended == "eof" and lasted == float("inf"), (ended, lasted)  # (all of it sent)


def test_a_refusal_made_while_the_server_stops_closes_at_once():
    """A request whose body was still coming when the stop began (its answer awaited: the stop waits
    for it) got its 408 during the stop: its drain began then, the stop already told, and held the
    stop until the drain ended (a client trickling bytes: DRAIN_S, 5 s at the gateway's bounds, its
    whole grace). A refusal made while the server stops closes at once."""

    class _Long(_Quick):
        read_s, drain_s = 0.5, 8.0

    stopping = threading.Event()
    with socket.socket() as s:
        with serving(_answer, _Long) as port:
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nx")
            # (its body, then the drain's bytes)
            threading.Thread(target=_trickle, args=(s, stopping), daemon=True).start()
            time.sleep(0.1)  # (its head read: the request is under way as the stop begins)
            began = time.monotonic()
        stopped_s = time.monotonic() - began  # (the 408 comes at read_s, during the stop)
        stopping.set()
    assert stopped_s < _Long.drain_s / 2, stopped_s  # (~read_s; it was read_s + drain_s)
