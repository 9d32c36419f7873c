"""`dayzero up --example` (what `make run` shows) against a gateway that refuses it or fails it: the
example says so in one line, sent as a client of that gateway would send it."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dayzero import cli_up
from dayzero.settings import Settings

UNAUTHORIZED = b'{"error": {"message": "missing or invalid API key", "code": "invalid_api_key"}}'
FAILED_STREAM = (
    b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {"content": "The"}}]}\n\n'
    b'data: {"error": {"message": "the worker died", "code": "generation_failed"}}\n\n'
    b"data: [DONE]\n\n"
)


def _gateway(keys: set[str], seen: list[str | None]) -> ThreadingHTTPServer:
    """Answers each chat request as the gateway would: 401 without a key it holds, else a stream
    whose request fails after one token."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.headers.get("authorization"))
            allowed = not keys or self.headers.get("authorization") in {f"Bearer {k}" for k in keys}
            status, kind, body = (200, "text/event-stream", FAILED_STREAM) if allowed else (401, "json", UNAUTHORIZED)
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("keys", [set(), {"k1", "k2"}])
def test_the_example_sends_a_key_and_says_why_it_failed(keys, capsys):
    """Under DAYZERO_API_KEYS the example got a 401 and printed nothing at all; a stream's error
    event was a KeyError's traceback (`make run` ended)."""
    seen: list[str | None] = []
    server = _gateway(keys, seen)
    try:
        cli_up._example(f"http://127.0.0.1:{server.server_port}", Settings(api_keys=",".join(sorted(keys))))
    finally:
        server.shutdown()
        server.server_close()
    out, err = capsys.readouterr()
    assert seen == ([f"Bearer {min(keys)}"] if keys else [None])
    assert out == "The"
    assert err.splitlines()[-1] == "example request failed: the worker died"


def test_a_refused_example_is_one_line_with_the_status(capsys):
    seen: list[str | None] = []
    server = _gateway({"k1"}, seen)
    try:
        cli_up._example(f"http://127.0.0.1:{server.server_port}", Settings())
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"example request refused: HTTP 401 {UNAUTHORIZED.decode()}"


def test_an_example_the_gateway_never_answers_is_one_line(capsys):
    """(httpx's ConnectError was a traceback.)"""
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli_up._example(f"http://127.0.0.1:{port}", Settings())
    assert capsys.readouterr().err.splitlines()[-1].startswith("example request failed: ConnectError(")
