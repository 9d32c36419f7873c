"""The one Celery app: a queue per stage, Redis broker, late acks, prefetch 1."""

from __future__ import annotations

from celery import Celery

from ..settings import Settings

STAGES = ("vision", "prefill", "decode")
TASKS = {stage: f"dayzero.{stage}" for stage in STAGES}


def make_celery(settings: Settings) -> Celery:
    app = Celery("dayzero", broker=settings.redis_url)
    app.conf.update(
        task_routes={name: {"queue": stage} for stage, name in TASKS.items()},
        task_serializer="json",  # messages are data: never a pickle off the broker
        accept_content=["json"],
        task_acks_late=True,  # a task is acked when its request is finished: a dead worker's work comes back
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit_s,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
    )
    return app
