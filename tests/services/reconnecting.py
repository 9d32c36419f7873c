"""A Celery worker process on dayzero's own app (``queue.make_celery``: its broker settings, its
consumer) with one task, ``touch(mark)``, which makes the file ``mark``; without dayzero's stage
wiring (worker.py), so Celery's reconnect lines are all in its log. Its process:
``python -m tests.services.reconnecting REDIS_URL``."""

from __future__ import annotations

import sys
from pathlib import Path

from celery import Celery

from dayzero.serving.queue import make_celery
from dayzero.settings import Settings

QUEUE = "reconnecting"


def touching_app(url: str) -> Celery:
    app = make_celery(Settings(redis_url=url))

    @app.task(name="touch")
    def touch(mark: str) -> None:
        Path(mark).touch()

    return app


if __name__ == "__main__":
    argv = ["worker", "-Q", QUEUE, "-P", "threads", "-c", "1", "--loglevel", "INFO", "--without-gossip"]
    touching_app(sys.argv[1]).worker_main([*argv, "--without-mingle", "--without-heartbeat"])
