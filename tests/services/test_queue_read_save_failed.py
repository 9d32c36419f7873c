"""A Redis whose save failed refuses writes and PING (MISCONF), the health check redis-py sends on a
connection idle past ``health_check_interval`` (kombu's: 25 s): on the consumer's queue read after a
pause (every thread busy), and on its subscriptions' connection (Celery's remote control) every
interval. Each was a ResponseError, which Celery took for an unrecoverable error: the worker exited
within one interval of the failed save. Now each is a lost connection, which Celery reconnects from
(its channel's own PING refused too: it tries again, as with Redis down). Real Redis, a real Celery
worker process over dayzero's transport (tests/services/save_failed.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange, Queue

from dayzero.serving import broker

from .conftest import stopped, wait_until
from .save_failed import QUEUE, napping_app, save_failed

ROOT = Path(__file__).resolve().parents[2]
HEALTH_CHECK_S = 1.0


def test_a_worker_lives_through_a_failed_save_and_consumes_after(redis_url, tmp_path):
    r, log = redis.Redis.from_url(redis_url), tmp_path / "worker.log"
    app, first, second = napping_app(redis_url, HEALTH_CHECK_S), tmp_path / "first", tmp_path / "second"
    cmd = [sys.executable, "-m", "tests.services.save_failed", redis_url, str(HEALTH_CHECK_S)]
    worker = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "ready." in log.read_text(), 60), log.read_text()
        app.send_task("nap", args=[3 * HEALTH_CHECK_S, str(first)], queue=QUEUE)  # (no queue read meanwhile)
        assert wait_until(lambda: "received" in log.read_text(), 30)
        with save_failed(r):
            assert wait_until(first.exists, 30)
            wait_until(lambda: worker.poll() is not None, 3 * HEALTH_CHECK_S)  # (its health checks refused)
        assert worker.poll() is None, log.read_text()[-3000:]  # was: "Unrecoverable error: ... MISCONF", exit 0
        app.send_task("nap", args=[0, str(second)], queue=QUEUE)
        assert wait_until(second.exists, 60), log.read_text()[-3000:]
    finally:
        stopped(worker)
    assert "Unrecoverable error" not in log.read_text()


def test_a_queue_read_after_a_pause_whose_health_check_is_refused_is_a_lost_connection(redis_url):
    r, queue = redis.Redis.from_url(redis_url), Queue("paused-read", Exchange("paused-read"), "paused-read")
    options = {"health_check_interval": HEALTH_CHECK_S, "socket_timeout": 5}  # (was: a close waiting for ever)
    with Connection(redis_url, transport=broker.Transport, transport_options=options) as connection:
        connection.Consumer(queue, callbacks=[lambda *_: None]).consume()  # (no queue read sent yet)
        time.sleep(1.5 * HEALTH_CHECK_S)  # its connection idle past the health check's interval
        with save_failed(r), pytest.raises(redis.ConnectionError, match="health check: MISCONF"):
            connection.drain_events(timeout=2)  # a PING before the read (was: a ResponseError)
