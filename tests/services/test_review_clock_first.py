"""A gateway that does not know its offset to Redis's clock (Redis was down at its start) measures it
before a POST (services/gateway/app.py's ClockFirst). While Redis hangs (frozen: it takes the
connection and never answers), each POST sent a TIME of its own on a thread of the event loop's
default executor: N POSTs, N TIMEs of a 5 s timeout each, queued behind the executor's few threads
(on top of each POST's own wait on Redis). Now the POSTs meanwhile wait on the one under way. The
gateway in-process on a Redis of its own, frozen with SIGSTOP."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient

from dayzero.procs import free_port, start_redis
from dayzero.serving import redis_clock
from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

POSTS = 12
BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 2}


def test_posts_while_redis_hangs_and_the_clock_is_unknown_wait_on_one_time(demo_dir, tmp_path, monkeypatch):
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    sent = []  # the TIMEs the gateway sent to measure its offset
    real_sync = redis_clock.sync
    monkeypatch.setattr(redis_clock, "sync", lambda client: (sent.append(1), real_sync(client))[1])
    settings = Settings(checkpoint=demo_dir, redis_url=f"redis://127.0.0.1:{port}/0", lease_s=60)  # (no reaper pass)
    try:
        with TestClient(make_app(settings)) as gateway:
            server.send_signal(signal.SIGSTOP)
            monkeypatch.setattr(redis_clock, "_offset_s", None)  # (as if Redis had been down at the start)
            sent.clear()
            with ThreadPoolExecutor(POSTS) as pool:
                answers = list(pool.map(lambda _: gateway.post("/v1/completions", json=BODY), range(POSTS)))
            server.send_signal(signal.SIGCONT)  # (the gateway's stop closes its connections)
            assert [a.status_code for a in answers] == [503] * POSTS  # (Redis hung: its own wait failed)
            assert len(sent) == 1, len(sent)  # (was: one per POST)
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait(10)
