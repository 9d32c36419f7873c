"""Prefill stage: the Celery task admits a prompt into the packed-prefill loop and holds its ack."""

from __future__ import annotations

from dayzero.serving.messages import DecodeJob, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.queue import TASKS, make_celery
from dayzero.serving.worker import StageWorker
from dayzero.settings import Settings

settings = Settings()
app = make_celery(settings)


def _loop(runtime, celery):
    def send_decode(job: DecodeJob) -> None:
        celery.send_task(TASKS["decode"], args=[job.model_dump_json()])

    return PrefillLoop(runtime, send_decode)


stage = StageWorker(app, settings, "prefill", _loop, shared_pools=settings.handoff != "redis")


@app.task(name=TASKS["prefill"])
def prefill(job_json: str) -> None:
    stage.run(PrefillJob.model_validate_json(job_json))
