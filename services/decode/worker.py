"""Decode stage: the Celery task admits a request into the continuous-batching loop and holds
its ack until the request finishes, so a dead worker's requests come back."""

from __future__ import annotations

from celery import Celery, signals

from dayzero.parallel.collectives import Group
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.loop_stage import loop_stage
from dayzero.serving.messages import DecodeJob
from dayzero.serving.queue import TASKS, composer, make_celery
from dayzero.serving.queue_reads import QueueReads
from dayzero.serving.room import Prefetch, Room, to_decode
from dayzero.serving.runtime import Runtime
from dayzero.serving.worker import StageWorker
from dayzero.settings import Settings


def make_worker(settings: Settings, group: Group | None = None) -> Celery:
    """``group``: this worker is rank 0 of a tensor-parallel group (dayzero.serving.ranks)."""
    app = make_celery(settings)
    reads = QueueReads(app)  # its broker connections, named: its blocked queue read can be ended
    prefetch = Prefetch(reads)  # paused while what it handed back to the queue is not its to take
    signals.worker_ready.connect(prefetch.bind, weak=False)

    def make_loop(runtime: Runtime) -> DecodeLoop:  # what its pools cannot hold yet goes to a peer with room
        return DecodeLoop(runtime, Room(runtime, prefetch, to_decode(runtime, composer(app, "decode"))))

    stage = StageWorker(settings, "decode", loop_stage("decode", settings, False, make_loop, app, group), reads)

    @app.task(name=TASKS["decode"])
    def decode(job_json: str) -> None:
        stage.run(DecodeJob.model_validate_json(job_json))

    return app
