"""A gateway that stops (a rolling restart) ends its streams with ``shutting_down``; their clients may
resume them within the disconnect grace on another gateway, or on this one restarted. The stopping
gateway cancelled every request nobody read at once: each resume found its request cancelled. Now it
leaves the cancel to Redis, due at the grace's end, and a running gateway cancels it then unless a
client reads the request again, and no sooner than a grace after its own start. Real processes:
Redis, a gateway restarted under a real stack, workers."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
import redis

from dayzero.serving.keys import key

from .conftest import MODEL, resumed_events, sse_events, start_stack, wait_until

LONG = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 2048, "ignore_eos": True, "stream": True}
SHORT = 512  # a request resumed at once: still generating well past the stop (a cancel then ends it)
LONGEST = 4000  # a request left for the grace to cancel: still generating after a restart and a grace


class _Read(threading.Thread):
    """LONG (of ``max_tokens``) streamed until the gateway ends it: its id, resume token, event ids
    (``three``: set once three came) and payloads."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens, self.three = url, max_tokens, threading.Event()
        self.rid, self.token, self.seen, self.payloads = "", "", [], []

    def run(self) -> None:
        body = {**LONG, "max_tokens": self.max_tokens}
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=60) as r:
            self.rid, self.token = r.headers["x-request-id"], r.headers["x-resume-token"]
            for event_id, data in sse_events(r):
                if event_id:
                    self.seen.append(event_id)
                self.payloads.append(data)
                if len(self.seen) == 3:
                    self.three.set()


def _read_until_stopped(url: str, gateway, *max_tokens: int) -> list[tuple[str, str, list[str]]]:
    """Stream LONG once per ``max_tokens``, at once; stop the gateway (SIGTERM) once each had three
    tokens: each request's id, its resume token, the event ids seen (its stream ended ``shutting_down``)."""
    reads = [_Read(url, n) for n in max_tokens]
    for read in reads:
        read.start()
    assert all(read.three.wait(60) for read in reads)
    gateway.send_signal(signal.SIGTERM)
    for read in reads:
        read.join(60)
        payloads = read.payloads
        assert payloads[-1] == "[DONE]" and payloads[-2]["error"]["code"] == "shutting_down", payloads[-3:]
    gateway.wait(timeout=30)
    return [(read.rid, read.token, read.seen) for read in reads]


def _restarted(stack, grace_s: float) -> None:
    stack.child("gateway").env = {"DAYZERO_DISCONNECT_GRACE_S": str(grace_s)}
    assert stack.supervise() == ["gateway"]
    stack.until_ready("gateway", 120)  # (a StartFailed naming its exits and log if it cannot)
    stack.wait_ready(timeout_s=60)  # its reaper has read the workers: it admits


def _resumed_to_its_end(url: str, rid: str, token: str, seen: list[str], max_tokens: int) -> None:
    rest = resumed_events(url, rid, token, seen[-1])
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length", rest[-1]
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers)) and numbers[-1] == max_tokens  # in order, to its end


@pytest.mark.slow
def test_streams_a_stopped_gateway_ended_resume_on_the_next_one_and_one_left_is_cancelled(text_dir, tmp_path):
    settings = {"DAYZERO_MAX_TOKENS_LIMIT": str(LONGEST), "DAYZERO_DISCONNECT_GRACE_S": "60"}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, settings)
    r = redis.Redis.from_url(stack.redis_url)
    try:
        ((rid, token, seen),) = _read_until_stopped(stack.url, stack.child("gateway").proc, SHORT)
        _restarted(stack, 3)
        assert r.get(key("cancel", rid)) is None  # (was: cancelled as the gateway stopped)
        _resumed_to_its_end(stack.url, rid, token, seen, SHORT)

        # the soak's: dayzero up's one gateway took 4-6 s to stop and start again under load, against
        # the 5 s grace; a client reconnecting once it answered (SSE's retry: 1 s) found its request
        # cancelled by the new gateway's first reaper pass (the grace ended while no gateway could take
        # the resume): a gateway cancels what was left to Redis only once it has run for a grace itself.
        # Beside it, a client that does not come back: its request is cancelled once the grace has passed,
        # by the gateway that runs then (was: cancelled at once, or, left alone, generated to its end for nobody)
        gateway = stack.child("gateway").proc
        (rid, token, seen), (left, _, _) = _read_until_stopped(stack.url, gateway, LONG["max_tokens"], LONGEST)
        due = r.zscore(key("left"), rid)
        assert due is not None
        time.sleep(max(0.0, due - time.time()) + 0.5)  # a restart longer than the grace
        _restarted(stack, 3)
        time.sleep(1.0)  # the client comes back after SSE's retry
        assert r.get(key("cancel", rid)) is None
        _resumed_to_its_end(stack.url, rid, token, seen, LONG["max_tokens"])
        assert wait_until(lambda: r.get(key("done", rid)) == b"length", 10)  # (recorded after its last token)
        assert wait_until(lambda: r.get(key("done", left)) is not None, 60)
        assert r.get(key("done", left)) == b"cancelled" and len(r.xrange(key("tokens", left))) < LONGEST
        assert wait_until(lambda: r.zscore(key("left"), left) is None, 5)  # (the first one's: due in 60 s)
    finally:
        stack.stop()
