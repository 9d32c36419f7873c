"""A worker ready during a Redis outage, at a stage that none served before it: its readiness stamp
was refused, and it stamps again within a retry (``STAMP_RETRY_S``) of Redis's return. The
gateway's first pass after the outage keeps such a stage's count, the outage in it
(``count_again``), and one that came before that stamp took the stage for unserved and ended what
waited there 503 ``no_worker``, the worker ready (5 of 49 rounds at a 0.5 s pass period on a real
stack: ``bench/ready_during_outage.py``). Now that pass ends nothing as ``no_worker``, and the next
one comes ``RESTAMPED_S`` later. A real Redis, a gateway in-process, the worker's liveness ``Pulse``
stamping when the test says (after the gateway's first pass: the order of the race)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import redis
from fastapi.testclient import TestClient

from dayzero.serving.keys import key
from dayzero.serving.liveness import Pulse, connect
from dayzero.settings import Settings
from services.gateway import reaping
from services.gateway.app import make_app

from .conftest import MODEL, wait_until
from .test_decode_appends import writes_refused

LEASE_S = 0.4  # a reaper pass every 0.2 s
BOUND_S = 1.0
BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4}


def _redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def _counted_since(client: redis.Redis, when: float) -> bool:
    """A reaper pass read prefill's stamps after ``when`` (Redis's time)."""
    return float(client.get(key("counted", "prefill")) or 0) > when


def test_a_worker_ready_during_an_outage_keeps_what_waits_when_the_first_pass_comes_before_its_stamp(
    redis_url, demo_dir, monkeypatch
):
    monkeypatch.setattr(reaping, "RESTAMPED_S", 2.0)  # (the stamp below falls in it, whatever the load)
    client = redis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, checkpoint=demo_dir, lease_s=LEASE_S, no_worker_timeout_s=BOUND_S)
    worker = Pulse(connect(redis_url), "prefill")  # (started once the test lets it stamp)
    with TestClient(make_app(settings)) as gateway, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(gateway.post, "/v1/completions", json=BODY)
        assert wait_until(lambda: client.scard(key("active")), 10)  # waiting at prefill, which none serves
        assert wait_until(lambda: client.exists(key("unserved", "prefill")), 10)  # (its count runs)
        with writes_refused(client):
            time.sleep(BOUND_S + 0.5)  # (its count past the bound)
            worker.ready()  # refused: it stamps once Redis takes writes again
            back = _redis_now(client)  # (before any pass could count again)
        assert wait_until(lambda: _counted_since(client, back), 10)  # the first pass after, before its stamp
        worker.start()  # (its first stamp at once, ready)
        assert wait_until(lambda: client.hlen(key("ready", "prefill")), 10)
        stamped = _redis_now(client)
        assert wait_until(lambda: _counted_since(client, stamped), 10)  # the next pass, which sees it
        assert client.scard(key("active")) == 1 and not answer.done()  # (was: 503 no_worker at the first pass)
        worker.stop()  # none serves again: it ends at the bound from the worker's readiness
        ended = answer.result(timeout=30)
        assert ended.status_code == 503 and ended.json()["error"]["code"] == "no_worker"
