"""A stream the gateway ended because Redis hung (frozen past its read's bound: the client got the
``queue_unavailable`` error event and ``[DONE]``) has its request cancelled once Redis is back. Its
leave waited the disconnect grace as a client's that may resume, then, its unwatch failed meanwhile,
7 s more (``DAYZERO_REFUSED_CANCEL_AFTER_S``): decode generated 293 tokens for nobody after a 15 s
freeze (bench/hung_redis.py). Real processes: a Redis the stack starts (SIGSTOPped), a gateway, a
prefill and a decode worker."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest
import redis

from dayzero.serving.keys import key

from .conftest import MODEL, sse_events, start_stack, wait_until

LONG = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 2000, "ignore_eos": True, "stream": True}
# no lease lapses in the freeze (a re-run is another story); a grace longer than the test: only the
# gateway's own end of the stream cancels the request in time; a read unanswered 4 s past its block
# ends the stream (the gateway's commands' bound, 10 s by default: waited out for nothing)
SETTINGS = {
    "DAYZERO_LEASE_S": "30",
    "DAYZERO_DISCONNECT_GRACE_S": "60",
    "DAYZERO_KEEPALIVE_S": "1.0",
    "DAYZERO_GATEWAY_REDIS_TIMEOUT_S": "4",
}


@pytest.fixture(scope="module")
def stack(text_dir, tmp_path_factory):
    stack = start_stack(text_dir, tmp_path_factory.mktemp("logs"), {"vision": 0, "prefill": 1, "decode": 1}, SETTINGS)
    yield stack
    stack.stop()


class Reader(threading.Thread):
    """``LONG`` streamed to its end: its request id, the last event id and the error code it got."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.rid, self.last, self.error = url, None, "0-0", None
        self.decoding = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", f"{self.url}/v1/completions", json=LONG, timeout=120) as response:
            self.rid = response.headers["x-request-id"]
            for event_id, data in sse_events(response):
                if data == "[DONE]":
                    return
                if "error" in data:
                    self.error = data["error"]["code"]
                    continue
                self.last = event_id
                self.decoding.set()


def test_a_stream_ended_for_a_hung_redis_has_its_request_cancelled_once_redis_is_back(stack):
    r, reader = redis.Redis.from_url(stack.redis_url), Reader(stack.url)
    reader.start()
    assert reader.decoding.wait(60)
    stack.redis.send_signal(signal.SIGSTOP)
    try:
        reader.join(40)  # the read unanswered past its block + 4 s: the stream ends
    finally:
        stack.redis.send_signal(signal.SIGCONT)
    assert not reader.is_alive() and reader.error == "queue_unavailable"
    assert wait_until(lambda: r.get(key("done", reader.rid)) is not None, 20)
    assert r.get(key("done", reader.rid)) == b"cancelled"  # (was: length, generated to its max_tokens)
    last = r.xrevrange(key("tokens", reader.rid), count=1)[0][1]
    generated, got = int(last[b"i"]), int(reader.last.split("-")[0])  # (the end's index: the tokens before it)
    assert got <= generated < LONG["max_tokens"], (got, generated)
