"""A Redis whose save failed (``stop-writes-on-bgsave-error``): it answers MISCONF to every write and
to PING, a connection's health check. And a Celery worker over dayzero's transport for it: one thread,
one task (``nap``), its broker connections' health checked every ``health_check_s``. Its process:
``python -m tests.services.save_failed REDIS_URL HEALTH_CHECK_S``."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import redis
from celery import Celery

from dayzero.serving.broker import celery_broker

QUEUE = "save-failed"


@contextlib.contextmanager
def save_failed(r: redis.Redis):
    """Redis refuses writes and PING while inside: a save point set and a BGSAVE that failed (its
    folder one no file can be made in). Lifted on the way out: no save point, its folder as before."""
    folder = r.config_get("dir")["dir"]
    r.set("save-failed:change", 1)  # (a change to save)
    try:
        r.config_set("save", "3600 1")
        r.config_set("dir", "/proc")
        r.bgsave()
        while r.info("persistence")["rdb_bgsave_in_progress"]:
            time.sleep(0.05)
        yield
    finally:  # (a save point left: the Redis would not stop, its save on the way out failing)
        r.config_set("dir", folder)
        r.config_set("save", "")
        r.delete("save-failed:change")


def napping_app(url: str, health_check_s: float) -> Celery:
    """``nap(seconds, mark)``: sleeps, then makes the file ``mark`` (Redis may refuse writes as it ends)."""
    app = Celery("save_failed")
    app.conf.update(
        **celery_broker(url, {"ack_emulation": False, "health_check_interval": health_check_s}),
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name="nap")
    def nap(seconds: float, mark: str) -> None:
        time.sleep(seconds)
        Path(mark).touch()

    return app


if __name__ == "__main__":
    url, health_check_s = sys.argv[1], float(sys.argv[2])
    argv = ["worker", "-Q", QUEUE, "-P", "threads", "-c", "1", "--loglevel", "INFO", "--without-gossip"]
    napping_app(url, health_check_s).worker_main([*argv, "--without-mingle", "--without-heartbeat"])
