"""bench/sse_clients.py: the TTFT benches' clients. httpx stopped reading each answer at ``data: [DONE]``,
before the chunked body's end: httpx then closed the connection, and every request of
bench/overhead.py's "gateway" row paid a new one (the client's connect, the gateway's accept), which
the minimal client on its kept-alive socket never did: a part of the "httpx vs raw client" gap
that was the bench's, not the gateway's. Answers here come from the bench's canned server, whose
count of accepted connections is the check."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from sse_clients import CannedServer, RawClient, own_ttft, stream_once  # noqa: E402


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


EVENT = b'id: %d\r\ndata: {"choices":[{"index":0,"text":"a"}]}\r\n\r\n'
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\nx-request-id: cmpl-1\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
    + _chunk(EVENT % 1)
    + _chunk(EVENT % 2)
    + _chunk(b"data: [DONE]\r\n\r\n")
    + b"0\r\n\r\n"
)


def test_httpx_requests_share_one_connection():
    server = CannedServer(ANSWER)
    try:
        with httpx.Client(timeout=10) as client:
            answers = [stream_once(client, server.url, [0, 5, 7]) for _ in range(3)]
    finally:
        server.close()
    assert [a["rid"] for a in answers] == ["cmpl-1"] * 3
    assert all(a["send"] <= a["first"] for a in answers)
    assert server.connections == 1


def test_raw_client_keeps_the_answer_the_canned_server_replays():
    server = CannedServer(ANSWER)
    try:
        client = RawClient(server.url)
        sent = client.stream([0, 5, 7])
        client.close()
    finally:
        server.close()
    assert client.answer == ANSWER
    assert sent["rid"] == "cmpl-1" and sent["send"] <= sent["first"] <= sent["second"]


def test_own_ttft_times_both_clients():
    own = own_ttft(ANSWER, [0, 5, 7], 5)
    assert set(own) == {"httpx", "raw"}
    assert all(ms > 0 for ms in own.values())


def test_a_closed_canned_server_leaves_no_thread_behind():
    """Its accept thread stayed blocked in accept() after close() (a closed socket does not wake
    it): one thread and its listening socket for the process's life per own_ttft, each bench run."""
    before = set(threading.enumerate())
    server = CannedServer(ANSWER)
    with httpx.Client(timeout=10) as client:
        stream_once(client, server.url, [0, 5, 7])
    server.close()
    assert set(threading.enumerate()) == before


REFUSAL = b'HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"error":1}'


def test_raw_client_says_a_refusal_and_a_closed_connection_instead_of_waiting_forever():
    """It read until a chunked body's end: an error (a length, no chunks) kept it in recv() for good,
    and a connection closed under it spun on recv()'s b"" for good."""
    server = CannedServer(REFUSAL)
    client = RawClient(server.url)
    client.sock.settimeout(10)  # (before: TimeoutError here)
    try:
        with pytest.raises(RuntimeError, match="refused the request: b'HTTP/1.1 503"):
            client.stream([0, 5, 7])
    finally:
        client.close()
        server.close()
    listener = socket.create_server(("127.0.0.1", 0))
    client = RawClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
    threading.Thread(target=_close_after_the_request, args=(listener,), daemon=True).start()
    ended = []
    reader = threading.Thread(target=lambda: ended.append(_raised(client.stream, [0, 5, 7])), daemon=True)
    reader.start()
    reader.join(10)  # (before: still spinning)
    client.close()
    listener.close()
    assert ended == [ConnectionError], ended


def _close_after_the_request(listener: socket.socket) -> None:
    """Reads the request, then closes (a FIN: a close before it read would be a reset)."""
    conn = listener.accept()[0]
    conn.recv(65536)
    conn.close()


def _raised(call, *args) -> type | None:
    try:
        call(*args)
    except Exception as exc:
        return type(exc)
    return None


def test_raw_client_sends_its_next_request_on_a_new_connection_once_the_server_closed_the_idle_one():
    """uvicorn closes a kept-alive connection idle for 5 s (the other stack's warm-up in hops_ab.py): the
    next request went on the closed one and ended in ConnectionError. Each is sent once, here on a new
    connection; the server above, which read the request before closing, got it once too."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests, closed = [], threading.Event()
    threading.Thread(target=_answer_then_close_idle, args=(listener, requests, closed), daemon=True).start()
    client = RawClient(f"http://127.0.0.1:{listener.getsockname()[1]}")
    client.sock.settimeout(10)
    try:
        assert client.stream([0, 5, 7])["rid"] == "cmpl-1"
        assert closed.wait(10)
        assert client.stream([0, 5, 7])["rid"] == "cmpl-1"  # (before: ConnectionError, b'')
    finally:
        client.close()
        listener.close()
    assert len(requests) == 2


def _answer_then_close_idle(listener: socket.socket, requests: list, closed: threading.Event) -> None:
    """Two connections, each answering one request then closed (as uvicorn's keep-alive timeout does)."""
    for _ in range(2):
        conn = listener.accept()[0]
        with conn:
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                data += conn.recv(65536)
            requests.append(data)
            conn.sendall(ANSWER)
            conn.shutdown(socket.SHUT_WR)
        closed.set()
