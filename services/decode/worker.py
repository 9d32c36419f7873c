"""Decode stage: the Celery task admits a request into the continuous-batching loop and holds
its ack until the request finishes, so a dead worker's requests come back."""

from __future__ import annotations

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.messages import DecodeJob
from dayzero.serving.queue import TASKS, make_celery
from dayzero.serving.worker import StageWorker
from dayzero.settings import Settings

settings = Settings()
app = make_celery(settings)
stage = StageWorker(app, settings, "decode", lambda runtime, _celery: DecodeLoop(runtime), shared_pools=False)


@app.task(name=TASKS["decode"])
def decode(job_json: str) -> None:
    stage.run(DecodeJob.model_validate_json(job_json))
