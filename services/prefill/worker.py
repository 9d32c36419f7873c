"""Prefill stage: the Celery task admits a prompt into the packed-prefill loop and holds its ack."""

from __future__ import annotations

from celery import Celery, signals

from dayzero.parallel.collectives import Group
from dayzero.serving.loop_stage import loop_stage
from dayzero.serving.messages import PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.queue import TASKS, composer, make_celery
from dayzero.serving.queue_reads import QueueReads
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.serving.worker import StageWorker
from dayzero.settings import Settings


def make_worker(settings: Settings, group: Group | None = None) -> Celery:
    """``group``: this worker is rank 0 of a tensor-parallel group (dayzero.serving.ranks)."""
    app = make_celery(settings)
    shared = settings.handoff != "redis"  # decode reads prefill's pools in place
    reads = QueueReads(app)  # its broker connections, named: its blocked queue read can be ended
    prefetch = Prefetch(reads)  # paused while what it handed back to the queue is not its to take
    signals.worker_ready.connect(prefetch.bind, weak=False)

    def make_loop(runtime: Runtime) -> PrefillLoop:  # decode's jobs go out with their handoff marks; what its
        # blocks cannot hold goes back to prefill's queue for a peer with room
        room = Room(runtime, prefetch, to_prefill(runtime, composer(app, "prefill")))
        return PrefillLoop(runtime, composer(app, "decode"), room)

    stage = StageWorker(settings, "prefill", loop_stage("prefill", settings, shared, make_loop, app, group), reads)

    @app.task(name=TASKS["prefill"])
    def prefill(job_json: str) -> None:
        stage.run(PrefillJob.model_validate_json(job_json))

    return app
