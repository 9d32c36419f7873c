"""Vision stage: the Celery task encodes a request's images and forwards it to prefill."""

from __future__ import annotations

import threading

from celery import signals
from opentelemetry.instrumentation.celery import CeleryInstrumentor

from dayzero.serving.messages import PrefillJob
from dayzero.serving.queue import TASKS, make_celery
from dayzero.serving.vision_stage import VisionStage
from dayzero.serving.worker import exit_on_failure
from dayzero.settings import Settings
from dayzero.telemetry import setup_tracing

settings = Settings()
app = make_celery(settings)
_ready = threading.Event()
_stage: list[VisionStage] = []  # set once the worker starts (Celery owns the process)


def _start(sender=None, **_: object) -> None:
    def send_prefill(job: PrefillJob) -> None:
        app.send_task(TASKS["prefill"], args=[job.model_dump_json()])

    setup_tracing(settings, "vision")
    CeleryInstrumentor().instrument()
    stage = VisionStage(settings, getattr(sender, "hostname", None) or "vision", send_prefill)
    threading.Thread(target=stage.heartbeat_forever, name="vision-heartbeat", daemon=True).start()
    _stage.append(stage)
    _ready.set()


signals.worker_init.connect(exit_on_failure(_start, "vision"), weak=False)


@signals.worker_shutdown.connect(weak=False)
def _stop(**_: object) -> None:
    for stage in _stage:
        stage.stop.set()


@app.task(name=TASKS["vision"])
def vision(job_json: str) -> None:
    _ready.wait()
    _stage[0].run(PrefillJob.model_validate_json(job_json))
