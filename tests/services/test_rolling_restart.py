"""A gateway that stops (a rolling restart) ends its streams with ``shutting_down``; their clients may
resume them within the disconnect grace on another gateway, or on this one restarted. The stopping
gateway cancelled every request nobody read at once: each resume found its request cancelled. Now it
leaves the cancel to Redis, due at the grace's end, and a running gateway cancels it then unless a
client reads the request again, and no sooner than a grace after its own start. Real processes:
Redis, a gateway restarted under a real stack, workers."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import redis

from dayzero.serving.keys import key

from .conftest import MODEL, resumed_events, sse_events, start_stack, wait_until

LONG = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 2048, "ignore_eos": True, "stream": True}
LONGEST = 4000  # a request left for the grace to cancel: still generating after a restart and a grace


def _read_until_stopped(url: str, gateway, max_tokens: int = LONG["max_tokens"]) -> tuple[str, str, list[str]]:
    """Stream LONG; stop the gateway (SIGTERM) after three tokens: the request's id, its resume token,
    the event ids seen (its stream ended ``shutting_down``)."""
    seen, payloads = [], []
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "max_tokens": max_tokens}, timeout=60) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        for event_id, data in sse_events(r):
            if event_id:
                seen.append(event_id)
            payloads.append(data)
            if len(seen) == 3 and gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
    assert payloads[-1] == "[DONE]" and payloads[-2]["error"]["code"] == "shutting_down", payloads[-3:]
    gateway.wait(timeout=30)
    return rid, token, seen


def _restarted(stack, grace_s: float) -> None:
    stack.child("gateway").env = {"DAYZERO_DISCONNECT_GRACE_S": str(grace_s)}
    assert stack.supervise() == ["gateway"]
    stack.until_ready("gateway", 120)  # (a StartFailed naming its exits and log if it cannot)
    stack.wait_ready(timeout_s=60)  # its reaper has read the workers: it admits


def _resumed_to_its_end(url: str, rid: str, token: str, seen: list[str]) -> None:
    rest = resumed_events(url, rid, token, seen[-1])
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length", rest[-1]
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers)) and numbers[-1] == LONG["max_tokens"]  # in order, to its end


@pytest.mark.slow
def test_streams_a_stopped_gateway_ended_resume_on_the_next_one_and_one_left_is_cancelled(text_dir, tmp_path):
    settings = {"DAYZERO_MAX_TOKENS_LIMIT": str(LONGEST), "DAYZERO_DISCONNECT_GRACE_S": "60"}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, settings)
    r = redis.Redis.from_url(stack.redis_url)
    try:
        rid, token, seen = _read_until_stopped(stack.url, stack.child("gateway").proc)
        _restarted(stack, 3)
        assert r.get(key("cancel", rid)) is None  # (was: cancelled as the gateway stopped)
        _resumed_to_its_end(stack.url, rid, token, seen)

        # the soak's: dayzero up's one gateway took 4-6 s to stop and start again under load, against
        # the 5 s grace; a client reconnecting once it answered (SSE's retry: 1 s) found its request
        # cancelled by the new gateway's first reaper pass (the grace ended while no gateway could take
        # the resume): a gateway cancels what was left to Redis only once it has run for a grace itself
        rid, token, seen = _read_until_stopped(stack.url, stack.child("gateway").proc)
        due = r.zscore(key("left"), rid)
        assert due is not None
        time.sleep(max(0.0, due - time.time()) + 0.5)  # a restart longer than the grace
        _restarted(stack, 3)
        time.sleep(1.0)  # the client comes back after SSE's retry
        assert r.get(key("cancel", rid)) is None
        _resumed_to_its_end(stack.url, rid, token, seen)
        assert wait_until(lambda: r.get(key("done", rid)) == b"length", 10)  # (recorded after its last token)

        # a client that does not come back: its request is cancelled once the grace has passed, by the
        # gateway that runs then (was: cancelled at once, or, left alone, generated to its end for nobody)
        left, _, _ = _read_until_stopped(stack.url, stack.child("gateway").proc, LONGEST)
        _restarted(stack, 3)
        assert wait_until(lambda: r.get(key("done", left)) is not None, 60)
        assert r.get(key("done", left)) == b"cancelled" and len(r.xrange(key("tokens", left))) < LONGEST
        assert wait_until(lambda: r.zscore(key("left"), left) is None, 5)  # (the first one's: due in 60 s)
    finally:
        stack.stop()
