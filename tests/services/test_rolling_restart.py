"""A gateway that stops (a rolling restart) ends its streams with ``shutting_down``; their clients may
resume them within the disconnect grace on another gateway, or on this one restarted. The stopping
gateway cancelled every request nobody read at once: each resume found its request cancelled. Now it
leaves the cancel to Redis, due at the grace's end, and a running gateway cancels it then unless a
client reads the request again. Real processes: Redis, a gateway restarted under a real stack, workers."""

from __future__ import annotations

import signal
import time

import httpx
import redis

from dayzero.serving.keys import key

from .conftest import MODEL, sse_events, start_stack, wait_until

LONG = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 2048, "ignore_eos": True, "stream": True}


def _read_until_stopped(url: str, gateway) -> tuple[str, str, list[str], dict]:
    """Stream LONG; stop the gateway (SIGTERM) after three tokens: the request's id, its resume token,
    the event ids seen, and the stream's error event."""
    seen, payloads = [], []
    with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=60) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        for event_id, data in sse_events(r):
            if event_id:
                seen.append(event_id)
            payloads.append(data)
            if len(seen) == 3 and gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    return rid, token, seen, payloads[-2]


def _restarted(stack) -> None:
    gateway = stack.child("gateway").proc
    gateway.wait(timeout=30)
    assert stack.supervise() == ["gateway"]
    stack.wait_ready(timeout_s=120)


def _resumed_to_its_end(url: str, rid: str, token: str, seen: list[str]) -> None:
    rest = []
    with httpx.stream(
        "GET", f"{url}/v1/requests/{rid}/stream?resume_token={token}", headers={"Last-Event-ID": seen[-1]}, timeout=120
    ) as resumed:
        assert resumed.status_code == 200
        for event_id, data in sse_events(resumed):
            if data == "[DONE]":
                break
            rest.append((event_id, data))
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length", rest[-1]
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers)) and numbers[-1] == LONG["max_tokens"]  # in order, to its end


def test_a_stream_a_stopped_gateway_ended_resumes_on_the_next_one_and_one_left_is_cancelled(text_dir, tmp_path):
    grace = {"DAYZERO_DISCONNECT_GRACE_S": "60"}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, grace)
    try:
        r = redis.Redis.from_url(stack.redis_url)
        rid, token, seen, ended = _read_until_stopped(stack.url, stack.child("gateway").proc)
        assert ended["error"]["code"] == "shutting_down"
        stack.child("gateway").env = {"DAYZERO_DISCONNECT_GRACE_S": "2"}  # (the next stop's, below)
        _restarted(stack)
        assert r.get(key("cancel", rid)) is None  # (was: cancelled as the gateway stopped)
        _resumed_to_its_end(stack.url, rid, token, seen)

        # a client that does not come back: its request is cancelled at the grace's end (2 s), by the
        # gateway that runs then (was: left generating to its end for nobody)
        left, _, _, ended = _read_until_stopped(stack.url, stack.child("gateway").proc)
        assert ended["error"]["code"] == "shutting_down"
        _restarted(stack)
        assert wait_until(lambda: r.get(key("done", left)) is not None, 60)
        assert r.get(key("done", left)) == b"cancelled"
        assert wait_until(lambda: r.zscore(key("left"), left) is None, 5)  # (the resumed one's: due in 60 s)
    finally:
        stack.stop()


def test_a_stream_left_while_the_only_gateway_restarts_past_the_grace_resumes_on_it(text_dir, tmp_path):
    """The soak: ``dayzero up``'s one gateway took 4-6 s to stop and start again under load, against the
    5 s grace; a client reconnecting once it answered (SSE's retry: 1 s) found its request cancelled by
    the new gateway's first reaper pass: the grace had ended while no gateway could take the resume.
    A gateway now cancels the requests left to Redis only once it has run for a grace itself."""
    stack = start_stack(
        text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, {"DAYZERO_DISCONNECT_GRACE_S": "3"}
    )
    try:
        r = redis.Redis.from_url(stack.redis_url)
        rid, token, seen, ended = _read_until_stopped(stack.url, stack.child("gateway").proc)
        assert ended["error"]["code"] == "shutting_down"
        stack.child("gateway").proc.wait(timeout=30)
        due = r.zscore(key("left"), rid)
        assert due is not None
        time.sleep(max(0.0, due - time.time()) + 0.5)  # a restart longer than the grace
        _restarted(stack)
        time.sleep(1.0)  # the client comes back after SSE's retry
        assert r.get(key("cancel", rid)) is None  # (was: cancelled by the new gateway's first pass)
        _resumed_to_its_end(stack.url, rid, token, seen)
        assert r.get(key("done", rid)) == b"length"
    finally:
        stack.stop()
