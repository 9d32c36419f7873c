"""A gateway that begins to stop answers what it will not serve with 503 ``shutting_down`` and
``Retry-After``, never a dropped connection or a 500: a body still arriving (uvicorn cancelled its
request at the end of the shutdown grace and answered 500, the soak's slow bodies), a request that
arrives while it stops, one still waiting for a worker. Real processes: Redis and a gateway; the
refusal itself also on plain ASGI."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time

import httpx
import pytest

from services.gateway.stopping import Stopping

from .conftest import MODEL, start_gateway_alone

BODY = json.dumps({"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4}).encode()


def _answer(sock: socket.socket) -> tuple[bytes, dict[bytes, bytes], dict]:
    """What the server sent until it closed: status line, headers, JSON body."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    return status, headers, json.loads(body) if body.startswith(b"{") else {"raw": body.decode()}


def test_a_body_still_arriving_when_the_gateway_stops_gets_503_shutting_down(text_dir, tmp_path):
    settings = {"DAYZERO_SHUTDOWN_GRACE_S": "1", "DAYZERO_NO_WORKER_TIMEOUT_S": "3600"}
    stack = start_gateway_alone(text_dir, tmp_path, settings)
    gateway = stack.child("gateway").proc
    head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(BODY)}"
    try:
        with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as s:
            s.sendall(head.encode() + b"\r\n\r\n" + BODY[:10])  # the rest comes after the grace, or never
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(30)
            status, headers, body = _answer(s)
    finally:
        stack.stop()
    assert status == b"HTTP/1.1 503 Service Unavailable", (status, body)  # (was: uvicorn's 500, plain text)
    assert body["error"]["code"] == "shutting_down" and headers[b"retry-after"] == b"1", body


def test_a_request_the_stopping_server_cannot_answer_is_a_503_with_retry_after(text_dir, tmp_path):
    """A non-streamed request still waiting when its gateway begins to stop is answered at once:
    503 ``shutting_down`` with ``Retry-After``, as every other 503 the client may retry."""
    stack = start_gateway_alone(text_dir, tmp_path, {"DAYZERO_NO_WORKER_TIMEOUT_S": "3600"})
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 1}
    answers = []
    waiting = threading.Thread(
        target=lambda: answers.append(httpx.post(f"{stack.url}/v1/completions", json=body, timeout=30))
    )
    try:
        waiting.start()
        time.sleep(1.0)  # queued; no worker will take it
    finally:
        stack.stop()
        waiting.join(30)
    answer = answers[0]
    assert (answer.status_code, answer.json()["error"]["code"]) == (503, "shutting_down")
    assert answer.headers.get("retry-after") == "1"


async def _served(scope, receive, send) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models"])
def test_a_request_reaching_a_stopping_gateway_gets_503_and_its_connection_closes(path):
    async def requests() -> tuple[httpx.Response, httpx.Response]:
        stopping = Stopping(_served, drain_s=1.0, stopping=lambda: True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(stopping), base_url="http://x") as client:
            return await client.post(path, content=BODY), await client.get("/health")

    answer, health = asyncio.run(requests())
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down"
    assert answer.headers["retry-after"] == "1" and answer.headers["connection"] == "close"
    assert health.text == "served"  # health, readiness, metrics: answered to the end
