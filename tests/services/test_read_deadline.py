"""A client that sends its request too slowly gets a 408 and a closed connection; one that sends
it whole is answered however long the answer streams; one that takes none of its answer loses the
connection; a request on its way to a connection that was idle when the server began to stop is
answered (a real uvicorn server on a real socket)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from dayzero.procs import free_port
from services.gateway.deadline import RequestReadDeadline

from .protocol_server import serving

READ_S = 0.5
HEAD_BYTES = 1024


SENT: list[dict] = []  # the errors the protocol said it sent (the gateway counts them)


class _Quick(RequestReadDeadline):
    read_s, body_bytes_per_s, max_body_bytes, write_stall_s = READ_S, 1000, 2000, READ_S
    max_head_bytes = HEAD_BYTES
    error_sent = staticmethod(SENT.append)


FLOOD_ENDED = threading.Event()  # the endless answer saw its client's disconnect


async def _flood(receive, send) -> None:
    """Answers 64 KiB at a time until the connection is lost."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    gone = asyncio.ensure_future(receive())  # http.disconnect, once the connection is lost
    while not gone.done():
        await send({"type": "http.response.body", "body": bytes(1 << 16), "more_body": True})
    FLOOD_ENDED.set()


async def _slow_stream(scope, receive, send) -> None:
    """Reads the body, then answers in 4 parts over 4 x READ_S (``/flood``: without end)."""
    if scope["path"] == "/flood":
        return await _flood(receive, send)
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
    for i in range(4):
        await asyncio.sleep(READ_S)
        await send({"type": "http.response.body", "body": b"x", "more_body": i < 3})


@pytest.fixture(scope="module")
def server():
    with serving(_slow_stream, _Quick) as port:
        yield port


def _exchange(port: int, parts: list[bytes], pause_s: float) -> bytes:
    """Sends ``parts`` ``pause_s`` apart, then reads until the server closes (at most 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for part in parts:
            s.sendall(part)
            time.sleep(pause_s)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        return received


HEAD = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nconnection: close\r\n"


@pytest.mark.parametrize(
    "parts",
    [[b"POST / HTTP/1.1\r\nhost: x\r\nx-a: "], [HEAD + b"\r\nab"], [], [b"P", b"O", b"S"]],
    ids=["half a head", "half a body", "nothing", "a byte at a time"],
)
def test_a_request_not_sent_whole_in_time_gets_408_and_the_connection_closes(server, parts):
    SENT.clear()
    started = time.monotonic()
    received = _exchange(server, parts, pause_s=READ_S / 5)  # all sent before the deadline: no reset
    assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received
    body = json.loads(received.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_timeout" and body["error"]["type"] == "invalid_request_error"
    # counted (dayzero_request_errors_total), but for a connection that sent nothing: a browser's
    # preconnect, opened ahead of a request it may never make, counted one after 30 s
    assert ([body["error"]] if parts else []) == SENT
    assert time.monotonic() - started < READ_S + 2


def test_a_whole_request_is_answered_however_long_the_answer_takes(server):
    received = _exchange(server, [HEAD + b"\r\nabcd"], pause_s=0)  # answered over 4 x READ_S
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\nxxxx"), received


def test_a_large_body_gets_time_for_its_size(server):
    """2000 bytes at 1000 a second: READ_S + 2 s for the body, sent in two halves 3 x READ_S apart."""
    head = HEAD.replace(b"content-length: 4", b"content-length: 2000")
    received = _exchange(server, [head + b"\r\n" + b"a" * 1000, b"a" * 1000], pause_s=3 * READ_S)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received


def test_the_next_request_on_a_kept_connection_is_timed_again(server):
    kept = HEAD.replace(b"connection: close\r\n", b"") + b"\r\nabcd"
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(kept)
        first = b""
        while not first.endswith(b"xxxx"):  # answered over 4 x READ_S: longer than the deadline
            first += s.recv(65536)
        s.sendall(b"GET / HTTP/1.1\r\nho")  # the next request, never finished
        started, rest = time.monotonic(), b""
        while chunk := s.recv(65536):
            rest += chunk
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and rest.startswith(b"HTTP/1.1 408"), (first, rest)
    assert time.monotonic() - started < READ_S + 2


def test_a_pipelined_request_is_not_cut_while_it_waits_or_is_answered(server):
    """Two requests in one write: the second arrives whole while the first is answered, and is
    answered after it (each over 4 x READ_S)."""
    kept = HEAD.replace(b"connection: close\r\n", b"") + b"\r\nabcd"
    received = _exchange(server, [kept + HEAD + b"\r\nabcd"], pause_s=0)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2 and b"408" not in received, received


def test_a_chunked_body_gets_the_time_of_the_largest_body(server):
    """No length declared: READ_S + 2000 bytes at 1000 a second; halves sent 3 x READ_S apart."""
    head = HEAD.replace(b"content-length: 4\r\n", b"transfer-encoding: chunked\r\n") + b"\r\n"
    received = _exchange(server, [head + b"2\r\nab\r\n", b"2\r\ncd\r\n0\r\n\r\n"], pause_s=3 * READ_S)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received


def test_a_pipelined_request_is_not_timed_while_an_earlier_answer_goes_out(server):
    """The second request's body never comes: its 408 follows the first answer whole, never
    inside it (uvicorn reads no further until that answer is out)."""
    kept = HEAD.replace(b"connection: close\r\n", b"") + b"\r\nabcd"
    received = _exchange(server, [kept + HEAD + b"\r\n"], pause_s=0)  # the first answered over 4 x READ_S
    first, _, rest = received.partition(b"xxxx")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"408" not in first, received
    assert rest.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received


@pytest.mark.parametrize(
    "head",
    [b"Content-Length: -1\r\n", b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n"],
    ids=["a negative length", "a bad chunk size"],
)
def test_a_request_the_http_parser_refuses_gets_an_openai_error(server, head):
    SENT.clear()
    received = _exchange(server, [b"POST / HTTP/1.1\r\nhost: x\r\n" + head + b"\r\n"], pause_s=0)
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n"), received
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "bad_http" and error["type"] == "invalid_request_error", error
    assert [error] == SENT  # (counted: dayzero_request_errors_total)


def _headers(n: int) -> bytes:
    return b"".join(b"x-%04d: v\r\n" % i for i in range(n))  # 11 bytes each


@pytest.mark.parametrize(
    "start, unit",
    [(b"GET /?q=", b"a"), (b"GET / HTTP/1.1\r\n", _headers(1)), (b"GET / HTTP/1.1\r\nx-big: ", b"a")],
    ids=["a long URL", "many headers", "one long header"],
)
def test_a_head_over_the_bound_is_refused_before_it_ends(server, start, unit):
    """httptools bounds no head: 20 MB of headers were taken whole (the gateway's memory +300 MB,
    its event loop held ~7 s), one header's value gathered in time quadratic in its length. The head
    never ends here: refused once over the bound (within the bound before its last part)."""
    SENT.clear()
    halfway, over = unit * (HEAD_BYTES // 2 // len(unit)), unit * (HEAD_BYTES // len(unit) + 1)
    received = _exchange(server, [start, halfway, over], pause_s=0.05)
    assert received.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), received
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "headers_too_large" and error["type"] == "invalid_request_error", error
    assert [error] == SENT  # (counted: dayzero_request_errors_total)


def test_a_whole_head_over_the_bound_is_refused(server):
    """Sent in one read (none of whose bytes the reads' count sees): refused for the head as parsed,
    counted, and not logged as malformed (uvicorn warned "Invalid HTTP request received." for each)."""
    SENT.clear()
    warned = _Records()
    logging.getLogger("uvicorn.error").addHandler(warned)
    try:
        received = _exchange(server, [b"GET / HTTP/1.1\r\n" + _headers(HEAD_BYTES // 11 + 1) + b"\r\n"], pause_s=0)
        _exchange(server, [b"POST / HTTP/1.1\r\nhost: x\r\nContent-Length: -1\r\n\r\n"], pause_s=0)  # malformed
    finally:
        logging.getLogger("uvicorn.error").removeHandler(warned)
    assert received.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), received
    assert [error["code"] for error in SENT] == ["headers_too_large", "bad_http"]
    assert [record.getMessage() for record in warned.records] == ["Invalid HTTP request received."]  # the 400's


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_head_within_the_bound_is_answered_and_the_next_is_counted_afresh(server):
    """Each request on a kept connection is counted anew: two heads near the bound are answered."""
    head = b"GET / HTTP/1.1\r\nhost: x\r\n" + _headers(HEAD_BYTES // 11 - 10)
    parts = [head[:20], head[20:] + b"\r\n", head[:20], head[20:] + b"connection: close\r\n\r\n"]
    received = _exchange(server, parts, pause_s=0.1)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2 and received.endswith(b"xxxx"), received


def test_the_gateway_counts_the_errors_its_connections_send_before_any_route(demo_dir, tmp_path):
    """A malformed request's 400 (as a 408) is sent by the connection's protocol, before the app:
    dayzero_request_errors_total{code} left it out, and a client hammering malformed requests
    showed on no metric. One pipelined behind /health is answered after it (it was answered in its
    place, and /health's 200 never went out)."""
    from .conftest import start_gateway_alone

    gateway = start_gateway_alone(demo_dir, tmp_path)
    malformed = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nContent-Length: -1\r\n\r\n"
    try:
        port = int(gateway.url.rpartition(":")[2])
        for before in (b"", b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"):
            received = _exchange(port, [before + malformed], 0)
            answered = [b"200"] * bool(before) + [b"400"]
            assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == answered, received
        scraped = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        assert 'dayzero_request_errors_total{code="bad_http"} 2.0' in scraped, scraped[-2000:]
    finally:
        gateway.stop()


def test_a_client_that_takes_nothing_of_its_answer_loses_the_connection(server):
    """It never reads: the answer fills the socket's buffers, and after ``write_stall_s`` with
    nothing taken the connection is dropped and the app sees the disconnect (an SSE stream waited
    in its send for ever, holding the connection and its request)."""
    FLOOD_ENDED.clear()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server))
        s.sendall(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
        assert FLOOD_ENDED.wait(10), "the answer waited on a client that reads nothing"


class _Lingering(_Quick):
    stop_linger_s = 4 * READ_S


def test_a_request_on_its_way_when_the_server_begins_to_stop_is_answered():
    """uvicorn closed a connection with no request under way as soon as it began to stop: the request
    its client had just sent (a kept-alive connection's next, a new connection's first) met a closed
    connection, not an answer (the soak's dropped bodies at a gateway's stop)."""
    config = uvicorn.Config(_slow_stream, port=free_port(), http=_Lingering, lifespan="off", log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    assert _until(lambda: running.started)
    with socket.create_connection(("127.0.0.1", config.port), timeout=10) as s:
        assert _until(lambda: running.server_state.connections)  # accepted: idle, no request yet
        running.should_exit = True
        assert _until(lambda: not running.servers[0].is_serving())  # stopping: each connection told so
        s.sendall(HEAD + b"\r\nabcd")
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received  # (was: b"", the connection closed)
    thread.join(10)
    assert not thread.is_alive()


def _until(predicate, timeout_s: float = 10) -> bool:
    deadline = time.time() + timeout_s
    while not predicate() and time.time() < deadline:
        time.sleep(0.01)
    return bool(predicate())
