"""A prefill or decode loop over its Runtime as a StageWorker's Stage (serving/worker.py): built when
Celery starts the worker, its stop handing back what it holds (hand_back.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..parallel.collectives import Group
from ..settings import Settings
from .queue import rerun_messages

if TYPE_CHECKING:  # (vision's worker builds no Runtime: its import, the model's and the kernels', is a loop stage's)
    from .kept_handoffs import KeptHandoffs
    from .runtime import Runtime


@dataclass
class LoopStage:
    """A prefill or decode loop over its runtime, as a Stage; ``rerun``: its stop's hand back of a run it
    holds (hand_back.handing_back); ``handoffs``: prefill's, kept till decode copies them."""

    runtime: Runtime
    loop: Any  # PrefillLoop | DecodeLoop: intake, stop, run_forever, hand_back
    rerun: Callable[[str, int, bool], bool]
    handoffs: KeptHandoffs | None = None
    ended: bool = False  # its loop ended (not one abandoned under a step: a stop's runs given up are no failure)

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def stop(self) -> threading.Event:
        return self.loop.stop

    @property
    def grouped(self) -> bool:
        return self.runtime.ranks.size > 1

    def run_forever(self) -> None:
        try:
            self.loop.run_forever()
            self.ended = True
        finally:
            self.runtime.ranks.stop()  # from the loop's thread, the one that talks to the other ranks

    def handle(self, job: Any) -> None:
        self.loop.intake.submit(job).done.wait()

    def snapshot(self) -> dict:
        return self.runtime.snapshot(1)

    def leave(self) -> None:
        self.runtime.presence.leave()

    def stuck(self) -> bool:
        return self.loop.heartbeat.stuck()

    def hand_back(self, until: float) -> None:
        spared = self.ended  # (a loop stuck in a step, a stop of a frozen worker: its runs count as failed)
        self.loop.hand_back(lambda rid, attempt: self.rerun(rid, attempt, spared))
        if self.handoffs is not None and self.ended:  # (a loop stuck in a step may still free them itself)
            self.handoffs.wait_taken(until)

    def close(self) -> None:
        self.runtime.close()


def loop_stage(
    stage: str,
    settings: Settings,
    shared_pools: bool,
    make_loop: Callable[[Runtime], Any],
    app: Celery,
    group: Group | None = None,
):
    """The ``build`` of a StageWorker whose stage is a loop over a Runtime (prefill, decode), its
    Celery ``app`` (its stop re-runs what it holds: ``queue.rerun_messages``); ``group``: the worker
    is rank 0 of that tensor-parallel group."""

    def build(name: str) -> LoopStage:
        from .hand_back import handing_back
        from .runtime import Runtime

        runtime = Runtime.load(settings, name, stage, shared=shared_pools, group=group)
        runtime.warm_up(decode=stage == "decode")  # before it announces itself: the first request waits for none
        s = runtime.settings
        messages = rerun_messages(app)
        rerun = handing_back(runtime.store, runtime.name, messages, s.visibility_timeout_s, s.shutdown_grace_s)
        loop = make_loop(runtime)
        return LoopStage(runtime, loop, rerun, loop.handed_off if stage == "prefill" else None)

    return build
