"""Shared wiring of a stage worker: load the runtime when Celery starts, run the loop thread."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, signals
from opentelemetry.instrumentation.celery import CeleryInstrumentor

from ..settings import Settings
from ..telemetry import setup_tracing
from .metrics import serve_metrics
from .runtime import Runtime

log = logging.getLogger("dayzero.worker")


def exit_on_failure(start: Callable[..., None], stage: str) -> Callable[..., None]:
    """A ``worker_init`` receiver that ends the process when the start fails: Celery would log
    nothing and serve on without a runtime (a silent hang); ``dayzero up`` reports the exits."""

    def receiver(*args: object, **kwargs: object) -> None:
        try:
            start(*args, **kwargs)
        except Exception:
            log.exception("the %s worker cannot start", stage)
            logging.shutdown()
            os._exit(3)

    return receiver


class StageWorker:
    """Holds one stage's runtime and loop for the life of the worker process."""

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        stage: str,
        make_loop: Callable[[Runtime, Celery], Any],
        shared_pools: bool,
    ) -> None:
        self.app, self.settings, self.stage = app, settings, stage
        self._make_loop, self._shared = make_loop, shared_pools
        self.loop: Any = None
        self.runtime: Runtime | None = None
        self._ready = threading.Event()
        signals.worker_init.connect(exit_on_failure(self._start, stage), weak=False)
        signals.worker_shutting_down.connect(self._exit_soon, weak=False)
        signals.worker_shutdown.connect(self._stop, weak=False)

    def _start(self, sender: object = None, **_: object) -> None:
        name = getattr(sender, "hostname", None) or self.stage  # celery's -n, e.g. "decode0@host"
        setup_tracing(self.settings, self.stage)
        CeleryInstrumentor().instrument()
        self.runtime = Runtime.load(self.settings, name, self.stage, shared=self._shared)
        if self.settings.metrics_port:
            serve_metrics(self.settings.metrics_port, lambda: {self.runtime.name: self.runtime.snapshot(1)})
        self.loop = self._make_loop(self.runtime, self.app)
        threading.Thread(target=self.loop.run_forever, name=f"{self.stage}-loop", daemon=True).start()
        self._ready.set()
        log.info("%s ready", self.runtime.name)

    def _exit_soon(self, **_: object) -> None:
        """SIGTERM: Celery's warm shutdown waits for running tasks (whole generations) and, with
        Redis down, for a reconnect that may never come; end the process after the grace period
        whatever it waits for (unfinished requests' leases lapse and the reaper re-runs them)."""

        def exit_later() -> None:
            time.sleep(self.settings.shutdown_grace_s)
            log.warning("%s still stopping after %.0f s; exiting", self.stage, self.settings.shutdown_grace_s)
            self._stop()
            logging.shutdown()
            os._exit(0)

        threading.Thread(target=exit_later, name="exit-watchdog", daemon=True).start()

    def _stop(self, **_: object) -> None:
        if self.loop is not None:
            self.loop.stop.set()
        if self.runtime is not None:
            self.runtime.close()

    def run(self, job: Any) -> None:
        """Called by the Celery task: admit the job and wait until the loop settles it."""
        self._ready.wait()
        self.loop.intake.submit(job).done.wait()


def worker_argv(stage: str, concurrency: int, name: str) -> list[str]:
    return [
        "worker",
        "-Q",
        stage,
        "-P",
        "threads",
        "-c",
        str(concurrency),
        "-n",
        name,
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
