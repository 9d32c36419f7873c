"""The gateway's access log names the requests each line answers (``dayzero up``'s gateway.log, a
container's output): a client's ``X-Request-Id`` finds its line. A gateway process and its Redis,
no workers: a stream's response starts (and its line is logged) before any token."""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from dayzero.serving.lifecycle import Lifecycle

from .conftest import MODEL, start_gateway_alone, wait_until


@pytest.fixture(scope="module")
def gateway(demo_dir, tmp_path_factory):
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"))
    yield stack
    stack.stop()


def _lines(stack) -> list[str]:
    return (stack.log_dir / "gateway.log").read_text().splitlines()


def _access_lines(stack, path: str) -> list[str]:
    return [line for line in _lines(stack) if f'"POST {path} HTTP/1.1"' in line]


def test_an_access_line_ends_with_the_ids_of_the_requests_it_answered(gateway):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "n": 2, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        ids = r.headers["x-request-id"]  # one per choice
    refused = httpx.post(f"{gateway.url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)
    assert refused.status_code == 404 and "x-request-id" not in refused.headers
    lines = wait_until(
        lambda: len(_access_lines(gateway, "/v1/completions")) >= 2 and _access_lines(gateway, "/v1/completions"), 10
    )
    assert lines, "no access line"
    assert lines[0].endswith(f" 200 OK request {ids}")
    assert lines[1].endswith(" 404 Not Found")  # refused before admission: no request to name


def test_a_pipelined_probe_after_an_api_response_names_no_request(gateway):
    """uvicorn starts a pipelined request (sent before the answer to the one ahead of it) from the task
    that answered that one: its context came along, and a probe's line named the request before it."""
    store = Lifecycle.connect(gateway.redis_url, 60)
    body = json.dumps({"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "stream": True})
    head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    host, port = urlsplit(gateway.url).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"{head}\r\n\r\n{body}GET /health HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        got = b""
        while not (named := re.search(rb"(?i)\r\nx-request-id: (\w+)\r\n", got)):
            assert (more := conn.recv(65536)), got  # (closed before the stream's head)
            got += more
        assert store.settle(named[1].decode(), 0, "", "error", end_at=0, message="ended by the test")  # its end
        probe = f'127.0.0.1:{conn.getsockname()[1]} - "GET /health HTTP/1.1"'
        lines = wait_until(lambda: [line for line in _lines(gateway) if probe in line], 10)
    assert lines and lines[0].endswith(" 200 OK"), lines  # (was: '200 OK request <the stream's id>')
