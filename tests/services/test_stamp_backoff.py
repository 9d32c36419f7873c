"""A worker's liveness stamps while Redis refuses writes, against a real Redis: every refused stamp
went again 0.1 s later however long the refusal (ten refused scripts a second a worker: 1,000
workers ~9,000 a second, bench/refused_stamps.py); now after ``QUICK_RETRIES_S`` one a stamp
period, jittered (``retry_after``), and a stamp that Redis takes again after failed ones wakes the
workers backing off, which stamp at once (not up to a period and a half later)."""

from __future__ import annotations

import time

import redis
from fastapi.testclient import TestClient

from dayzero.serving import liveness
from dayzero.serving.keys import key
from dayzero.serving.liveness import FRESH_S, Pulse, connect
from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import wait_until
from .test_decode_appends import writes_refused


def _errors(client: redis.Redis) -> int:
    """The error replies Redis has sent (a refused stamp is one)."""
    return sum(error["count"] for error in client.info("errorstats").values())


def _stamp(client: redis.Redis, pulse: Pulse) -> float:
    return float(client.hget(key("alive", pulse.stage), pulse.process) or 0)


def _pulse(redis_url: str, name: str) -> Pulse:
    pulse = Pulse(connect(redis_url), "prefill")
    pulse.process = name  # (two in one process)
    return pulse


def test_refused_stamps_back_off_after_the_quick_retries(redis_url, monkeypatch):
    monkeypatch.setattr(liveness, "QUICK_RETRIES_S", 0.5)
    client = redis.Redis.from_url(redis_url)
    pulse = _pulse(redis_url, "worker:backing-off")
    try:
        with writes_refused(client):
            pulse.start()
            time.sleep(1.0)  # (past the quick retries)
            before = _errors(client)
            time.sleep(3.0)
            refused = _errors(client) - before
        assert 1 <= refused <= 6  # a stamp period apart (was: every 0.1 s, ~30)
    finally:
        pulse.stop()


def test_a_stamp_taken_again_wakes_the_workers_backing_off(redis_url, monkeypatch):
    monkeypatch.setattr(liveness, "QUICK_RETRIES_S", 0.0)
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", 30.0)  # (backing off 15-45 s)
    client = redis.Redis.from_url(redis_url)
    first, other = _pulse(redis_url, "worker:first"), _pulse(redis_url, "worker:other")
    try:
        with writes_refused(client):
            before = _errors(client)
            first.start(), other.start()
            assert wait_until(lambda: _errors(client) >= before + 2, 10)  # both refused, backing off
            time.sleep(0.5)  # (both waiting)
        seconds, micros = client.time()
        back = seconds + micros / 1e6
        first.ready()  # a stamp Redis takes, after its refused one
        assert _stamp(client, first) > back
        assert wait_until(lambda: _stamp(client, other) > back, 5)  # (was: its wait's end, 15-45 s on)
    finally:
        first.stop(), other.stop()


def test_ready_that_finds_no_live_worker_wakes_the_workers_backing_off(redis_url, demo_dir, monkeypatch):
    """After a refusal longer than ``QUICK_RETRIES_S`` and the stamps' freshness, /ready said "no live
    worker" until the workers' next tries, up to 1.5 s on; now the first answer so wakes them."""
    monkeypatch.setattr(liveness, "QUICK_RETRIES_S", 0.0)
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", 30.0)  # (backing off 15-45 s)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    worker = _pulse(redis_url, "worker:decode")
    worker.stage = "decode"
    settings = Settings(redis_url=redis_url, checkpoint=demo_dir)
    try:
        with TestClient(make_app(settings)) as gateway:
            worker.ready()
            with writes_refused(client):
                worker.start()  # refused: backing off
                time.sleep(FRESH_S + 0.5)  # (its stamp stale)
            seconds, micros = client.time()
            back = seconds + micros / 1e6
            assert "no live worker" in gateway.get("/ready").json()["reason"]
            assert wait_until(lambda: _stamp(client, worker) > back, 5)  # (was: 15-45 s on)
    finally:
        worker.stop()


def test_a_wake_between_a_refused_stamp_and_its_wait_is_not_missed(redis_url, monkeypatch):
    """Redis takes writes again and a stamp wakes the others (``wake_stampers``) after a worker's
    stamp was refused but before its wait began: the wait looked only for wakes from its own start,
    so that worker missed it and stamped up to a period and a half later; a wake since its refused
    stamp was sent counts."""
    monkeypatch.setattr(liveness, "QUICK_RETRIES_S", 0.0)
    monkeypatch.setattr(liveness, "STAMP_EVERY_S", 30.0)  # (backing off 15-45 s)
    client = redis.Redis.from_url(redis_url)
    woken, wait = [], liveness.await_wake

    def woken_before_waiting(*args):
        if not woken:  # (the first wait: Redis back, and the others woken, before it reads)
            client.config_set("maxmemory", 0)
            liveness.wake_stampers(client)
            woken.append(time.monotonic())
        wait(*args)

    monkeypatch.setattr(liveness, "await_wake", woken_before_waiting)
    pulse = _pulse(redis_url, "worker:late")
    try:
        with writes_refused(client):
            pulse.start()
            assert wait_until(lambda: woken, 10)
        assert wait_until(lambda: _stamp(client, pulse) > 0, 5)  # (was: 15-45 s on)
    finally:
        pulse.stop()
