"""The clients the TTFT benches send a streamed completion with, and what each costs on its own.

``stream_once``: httpx, as a user's client would (its request built, its answer parsed by h11 and
split into lines), reading each answer to its end so that the next request goes over the same
connection. ``RawClient``: HTTP/1.1 on one keep-alive socket, parsing nothing but the events' ``id:``
lines and the chunked body's end: a client with (next to) no cost of its own. ``own_ttft``: each
client's time to the first event from ``CannedServer``, which answers every request at once with the
bytes of an answer the gateway gave: what the client itself adds to a TTFT.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import statistics
import threading
import time

import httpx

MODEL = "dayzero-demo"
ANSWER_END = b"\r\n0\r\n\r\n"  # the chunked body's last chunk


def completion_body(prompt: list[int]) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True, "temperature": 0, "ignore_eos": True}


def stream_once(client: httpx.Client, url: str, prompt: list[int]) -> dict:
    """One streamed request: its id and the client's clock (ns) at send and at the first token."""
    sent, first = time.time_ns(), None
    with client.stream("POST", f"{url}/v1/completions", json=completion_body(prompt)) as r:
        r.raise_for_status()
        # Read to the body's end: an answer left unread closes its connection, and the next request
        # paid a new connection (client and gateway) that no user's kept-alive client pays.
        for line in r.iter_lines():
            if first is None and line.startswith("id:"):
                first = time.time_ns()
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return {"rid": r.headers["x-request-id"], "send": sent, "first": first}


class RawClient:
    """A streamed request over one keep-alive socket; ``answer``: the last answer's bytes."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.address = host, (host, int(port))
        self._connect()
        self.answer = b""

    def _connect(self) -> None:
        self.sock = socket.create_connection(self.address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def stream(self, prompt: list[int]) -> dict:
        """One streamed request, on a new connection if the server closed this one while it was idle
        (uvicorn's keep-alive timeout, 5 s: the other stack's warm-up on a loaded machine ended
        hops_ab.py and ttft_ab.py with ConnectionError). A request is sent once: a connection closed
        after it went may have been read (a second send would be a request the bench never counted)."""
        if self._closed_idle():
            self.sock.close()
            self._connect()
        return self._stream(prompt)

    def _closed_idle(self) -> bool:
        """The server's close (a FIN, or a reset) waits on the socket, and no answer was due on it."""
        if not select.select([self.sock], [], [], 0)[0]:  # (nothing to read: still open)
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except ConnectionError:
            return True

    def _stream(self, prompt: list[int]) -> dict:
        body = json.dumps(completion_body(prompt)).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\ncontent-type: application/json\r\n"
        sent, stamps, data = time.time_ns(), [], b""
        self.sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        while not data.endswith(ANSWER_END):  # (an answer of another shape never ends so: refused below)
            received = self.sock.recv(65536)
            if not received:
                when = "mid-answer" if data else "before answering (not sent again: it may have read it)"
                raise ConnectionError(f"the server closed the connection {when}: {data[:300]!r}")
            data += received
            head, ended, rest = data.partition(b"\r\n\r\n")
            if ended and not head.startswith(b"HTTP/1.1 200 "):  # an error's body has a length, no chunks
                raise RuntimeError(f"the server refused the request: {data[:300]!r}")
            events = rest.count(b"\nid: ")
            stamps += [time.time_ns()] * (min(events, 2) - len(stamps))
        if not stamps:
            raise RuntimeError("the stream ended without a token")
        self.answer = data
        head_lines = data.partition(b"\r\n\r\n")[0].decode().lower().splitlines()
        rid = next(line.split(":", 1)[1].strip() for line in head_lines if line.startswith("x-request-id:"))
        return {"rid": rid, "send": sent, "first": stamps[0], "second": stamps[1] if len(stamps) > 1 else None}

    def close(self) -> None:
        self.sock.close()


class CannedServer:
    """A local HTTP/1.1 server (a thread per connection) answering each request, once its body is in,
    with ``answer`` at once; ``connections``: how many it accepted."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.connections = answer, 0
        self._served: list[tuple[socket.socket, threading.Thread]] = []  # each connection, its thread
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections += 1
            self._served.append((conn, threading.Thread(target=self._serve, args=(conn,), daemon=True)))
            self._served[-1][1].start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        with conn:
            while chunk := conn.recv(65536):
                data += chunk
                head, found, body = data.partition(b"\r\n\r\n")
                lines = head.decode().lower().split("\r\n")
                length = next((int(v.split(":")[1]) for v in lines if v.startswith("content-length:")), 0)
                if found and len(body) >= length:
                    data = body[length:]
                    conn.sendall(self.answer)

    def close(self) -> None:
        """Stops accepting and serving; every thread of its ends (a closed socket alone left the accept
        thread blocked in accept(); a connection's thread could still be reading its client's close)."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self._acceptor.join()
        self.sock.close()
        for conn, thread in self._served:
            with contextlib.suppress(OSError):  # (closed already: its client left first)
                conn.shutdown(socket.SHUT_RDWR)
            thread.join()


def own_ttft(answer: bytes, prompt: list[int], n: int) -> dict[str, float]:
    """p50 (ms) of each client's time to the first event from a server that sends ``answer`` at once,
    ``n`` requests each, alternated."""
    server = CannedServer(answer)
    raw, times = RawClient(server.url), {"httpx": [], "raw": []}
    with httpx.Client(timeout=10) as client:
        for k in range(n + 3):  # 3 warm-ups
            for name in ("httpx", "raw") if k % 2 == 0 else ("raw", "httpx"):
                sent = stream_once(client, server.url, prompt) if name == "httpx" else raw.stream(prompt)
                if k >= 3:
                    times[name].append((sent["first"] - sent["send"]) / 1e6)
    raw.close()
    server.close()
    return {name: statistics.median(values) for name, values in times.items()}
