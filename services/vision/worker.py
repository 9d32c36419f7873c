"""Vision stage: the Celery task encodes a request's images and forwards it to prefill."""

from __future__ import annotations

from celery import Celery

from dayzero.serving.messages import PrefillJob
from dayzero.serving.queue import TASKS, composer, make_celery
from dayzero.serving.queue_reads import QueueReads
from dayzero.serving.vision_stage import VisionStage
from dayzero.serving.worker import StageWorker
from dayzero.settings import Settings


def make_worker(settings: Settings) -> Celery:
    app = make_celery(settings)
    prefill_message = composer(app, "prefill")
    reads = QueueReads(app)  # its broker connections, named: its blocked queue read can be ended
    stage = StageWorker(settings, "vision", lambda name: VisionStage(settings, name, prefill_message), reads)

    @app.task(name=TASKS["vision"])
    def vision(job_json: str) -> None:
        stage.run(PrefillJob.model_validate_json(job_json))

    return app
