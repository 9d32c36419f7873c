"""Every admitted choice ends in /metrics exactly once: finished by its reason (stop, length,
cancelled, error) or left by its client; /metrics answers while Redis is down, and no request
after a Redis restart meets a connection it closed. A gateway
in-process on a real Redis; no workers: the test ends each request as a worker (or the reaper)
does, through the request lifecycle."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.procs import free_port, scratch_redis, start_redis
from dayzero.serving.lifecycle import Lifecycle
from dayzero.settings import Settings
from services.gateway.app import make_app
from services.gateway.shapes import Shape

from .conftest import MODEL, wait_until


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client, Lifecycle.connect(redis_url, 60)


def _finished(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    found = re.findall(r'^dayzero_requests_finished_total\{finish_reason="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {reason: float(value) for reason, value in found}


def _grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def _end(store: Lifecycle, rid: str, reason: str) -> None:
    assert store.settle(rid, 0, "", reason, end_at=0, message="ended by the test")  # as the reaper ends one


@pytest.mark.parametrize("reason", ["error", "cancelled"])
def test_a_stream_that_fails_counts_its_failure(gateway, reason):
    client, store = gateway
    before = _finished(client)
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        _end(store, r.headers["x-request-id"], reason)
        data = [line for line in r.iter_lines() if line.startswith("data:")]
    assert '"error"' in data[0] and data[-1] == "data: [DONE]"
    assert _grown(before, _finished(client)) == {reason: 1.0}


def test_a_choice_that_fails_in_a_stream_of_two_is_named_by_its_error_event_and_the_other_goes_on(gateway):
    """n = 2, streamed: choice 1 fails, choice 0 then finishes. Choice 1's error event says which
    choice it ended (its error object carries the choice's ``index``: it did not, and a client could
    not tell which choice of several had failed); choice 0's chunks go on; one [DONE] ends the stream."""
    client, store = gateway
    before = _finished(client)
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "n": 2, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        first, second = r.headers["x-request-id"].split(",")
        _end(store, second, "error")
        _end(store, first, "length")
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data:")]
    events = [json.loads(d) for d in data[:-1]]
    assert [e["error"] for e in events if "error" in e] == [
        {"message": "ended by the test", "type": "server_error", "param": None, "code": "generation_failed", "index": 1}
    ]
    assert [(c["index"], c["finish_reason"]) for e in events for c in e.get("choices", ())] == [(0, "length")]
    assert data[-1] == "[DONE]"
    assert _grown(before, _finished(client)) == {"error": 1.0, "length": 1.0}


def test_a_stream_the_gateway_fails_counts_an_error_and_logs_its_request(gateway, monkeypatch, caplog):
    """A fault of the gateway's own mid-stream: the client gets an error event, the metrics an error,
    the log the traceback under the request's id."""
    client, _ = gateway
    before = _finished(client)

    def broken(*_args, **_kwargs):
        raise RuntimeError("a chunk could not be shaped")

    monkeypatch.setattr(Shape, "chunk", broken)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:  # its first chunk (the role) fails
        rid = r.headers["x-request-id"]
        data = [line for line in r.iter_lines() if line.startswith("data:")]
    assert '"internal error"' in data[0] and data[-1] == "data: [DONE]"
    assert _grown(before, _finished(client)) == {"error": 1.0}
    assert f"the stream of request {rid} failed" in caplog.text and "a chunk could not be shaped" in caplog.text


def test_a_body_whose_choice_fails_counts_each_choice_once(gateway):
    """One of two choices fails: it counts as failed; its sibling, cut short by it, as an error."""
    client, store = gateway
    before, running = _finished(client), set(store.active())
    body = {"model": MODEL, "prompt": [[0, 5], [0, 6]], "max_tokens": 3}
    with ThreadPoolExecutor(1) as pool:  # the answer waits for both choices
        answer = pool.submit(client.post, "/v1/completions", json=body)
        assert wait_until(lambda: len(set(store.active()) - running) == 2, 10.0)
        _end(store, sorted(set(store.active()) - running)[0], "error")
        r = answer.result(timeout=30)
    assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
    assert _grown(before, _finished(client)) == {"error": 2.0}


def test_a_request_that_found_no_room_in_time_is_a_503_overloaded(gateway):
    """Prefill ends a prompt that waited for blocks past DAYZERO_TASK_TIME_LIMIT_S with the code
    ``overloaded`` (waiting.py): the server's state, not a failed generation (a 500), so a 503 with
    Retry-After, as OpenAI answers when overloaded; a stream's error event says the same."""
    client, store = gateway
    before, running = _finished(client), set(store.active())
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3}
    with ThreadPoolExecutor(1) as pool:  # the answer waits for its end
        answer = pool.submit(client.post, "/v1/completions", json=body)
        assert wait_until(lambda: set(store.active()) - running, 10.0)
        (rid,) = set(store.active()) - running
        assert store.settle(rid, 0, "", "error", end_at=0, message="no room in time", code="overloaded")
        r = answer.result(timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"] == {
        "message": "no room in time",
        "type": "service_unavailable",
        "param": None,
        "code": "overloaded",
    }
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as streamed:
        assert store.settle(streamed.headers["x-request-id"], 0, "", "error", 0, "no room in time", code="overloaded")
        data = [line for line in streamed.iter_lines() if line.startswith("data:")]
    assert '"code": "overloaded"' in data[0] and '"service_unavailable"' in data[0] and data[-1] == "data: [DONE]"
    assert _grown(before, _finished(client)) == {"error": 2.0}


def _errors(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    found = re.findall(r'^dayzero_request_errors_total\{code="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {code: float(value) for code, value in found}


def test_the_errors_sent_are_counted_by_their_code(gateway):
    """An operator tells the failures apart in /metrics: each error body and each stream's error
    event counts under its code (a 503 was a no_worker, an overload or Redis lost; a stream's error
    came in a 200). Before, only the HTTP status and a finish "error" were counted."""
    client, store = gateway
    before = _errors(client)
    assert client.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": [0, 5], "top_p": 7}).status_code == 400
    refused_key = {
        "model": MODEL,
        "prompt": [0, 5],
        "logit_bias": {"5.0": 1},
    }  # (OpenAI codes it null: invalid_value here, a 4xx's code is never null)
    assert client.post("/v1/completions", json=refused_key).status_code == 400
    running = set(store.active())
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client.post, "/v1/completions", json={"model": MODEL, "prompt": [0, 5], "max_tokens": 3})
        assert wait_until(lambda: set(store.active()) - running, 10.0)
        (rid,) = set(store.active()) - running
        assert store.settle(rid, 0, "", "error", end_at=0, message="no room in time", code="overloaded")
        assert answer.result(timeout=30).status_code == 503
    for code in ("no_worker", None):  # None: a failed generation
        body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 3, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert store.settle(r.headers["x-request-id"], 0, "", "error", 0, "ended by the test", code=code)
            assert r.status_code == 200 and any('"error"' in line for line in r.iter_lines())
    grown = _grown(before, _errors(client))
    assert grown == {
        "model_not_found": 1.0,
        "decimal_above_max_value": 1.0,  # (a validation 400's code, as OpenAI's)
        "invalid_value": 1.0,
        "overloaded": 1.0,
        "no_worker": 1.0,
        "generation_failed": 1.0,
    }


def test_metrics_are_served_while_redis_is_down(demo_dir):
    """An outage is when the gateway's own counters matter: the scrape leaves out only what it
    reads from Redis (queue depths, worker snapshots) and says Redis was not reached."""
    with scratch_redis() as port:
        client = TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=f"redis://127.0.0.1:{port}/0")))
        with client:
            assert "dayzero_queue_reachable 1.0" in client.get("/metrics").text
            client.post("/v1/completions", json={"model": "nope", "prompt": "x"})  # a 404 to count
            redis.Redis(port=port).shutdown(nosave=True)
            r = client.get("/metrics")
    assert r.status_code == 200 and "dayzero_queue_reachable 0.0" in r.text
    assert 'dayzero_http_responses_total{status="404"} 1.0' in r.text and "dayzero_queue_depth{" not in r.text


def test_requests_after_redis_came_back_do_not_meet_its_closed_connections(demo_dir, tmp_path):
    """Redis restarted: every pooled connection it closed is tried once more on a new one, so no
    request after the restart is a 503 (6 of a burst of 16 were, one per stale connection)."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 2, "stream": True}
    try:
        app = make_app(Settings(checkpoint=demo_dir, redis_url=f"redis://127.0.0.1:{port}/0"))
        with TestClient(app) as client, ThreadPoolExecutor(8) as pool:

            def admitted(_) -> int:  # the admission's Lua script, on the gateway's pool
                with client.stream("POST", "/v1/completions", json=body) as r:
                    return r.status_code

            assert set(pool.map(admitted, range(16))) == {200}  # several connections in the pool
            server.terminate()
            server.wait()
            server = start_redis(port, tmp_path / "redis.log")
            statuses = [admitted(i) for i in range(4)] + list(pool.map(admitted, range(16)))
    finally:
        server.terminate()
        server.wait()
    assert set(statuses) == {200}, statuses


def test_metrics_answer_quickly_while_redis_hangs(demo_dir):
    """A Redis that accepts nothing (stopped, or cut off) rather than refusing: the scrape gives up
    on it within its own short timeouts, well inside Prometheus' scrape timeout."""
    with scratch_redis() as port:
        client = TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=f"redis://127.0.0.1:{port}/0")))
        with client:
            assert "dayzero_queue_reachable 1.0" in client.get("/metrics").text
            pid = int(redis.Redis(port=port).info("server")["process_id"])
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                r = client.get("/metrics")
                took = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
    assert r.status_code == 200 and "dayzero_queue_reachable 0.0" in r.text and took < 4, took
