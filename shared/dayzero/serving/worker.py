"""Shared wiring of a stage worker: load the runtime when Celery starts, run the loop thread."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import redis
from celery import signals
from celery.exceptions import CPendingDeprecationWarning
from opentelemetry.instrumentation.celery import CeleryInstrumentor

from ..redis_refusals import REFUSED_EXIT, REFUSED_FOR_GOOD, refusal_said, refused_for_good
from ..settings import Settings
from ..shm import unlink_own
from ..telemetry import flush_spans, setup_tracing
from .liveness import Pulse, connect
from .metrics import serve_metrics
from .outage_log import BrokerOutageFilter
from .queue_reads import QueueReads

log = logging.getLogger("dayzero.worker")
# Celery's INFO line per task received (formatted and written before the task is handed to a thread)
# and per task done: the spans and the stage metrics say the same; their warnings and errors stay
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
# Celery 5's warning at a worker's first lost broker connection (9 lines) that Celery 6 cancels the
# tasks running then by default: dayzero's settings keep them running (queue.make_celery, broker.QoS)
CANCEL_AT_CONNECTION_LOSS = r"\s*In Celery 5.1 we introduced an optional breaking change"
OWN = str(Path(__file__).resolve().parent.parent) + os.sep  # dayzero's package: where its refusals are raised
LOOP_END_S = 2.0  # a stop waits this long at most for the loop to end (a step under way finishes first)
# a hand back ends this long before the grace: Celery's warm shutdown then ends, and the stage closes
# (its pool segment unlinked), before the watchdog's exit (an idle worker's whole stop took ~0.3 s)
CLOSE_MARGIN_S = 1.0


def _without_cancel_warning(**_: object) -> None:
    """(Once Celery's logging is set up: it shows every CPendingDeprecationWarning, each time.)"""
    warnings.filterwarnings("ignore", CANCEL_AT_CONNECTION_LOSS, CPendingDeprecationWarning)


def exit_on_failure(start: Callable[..., None], stage: str, url: str) -> Callable[..., None]:
    """A ``worker_init`` receiver that ends the process when the start fails: Celery would log
    nothing and serve on without a runtime (a silent hang); ``dayzero up`` reports the exits. A
    refusal is said in one line (its traceback followed it, and filled the end of the log ``up``
    shows): the Redis at ``url`` refusing the worker for good, or a ValueError dayzero raised, its
    refusals' type (the CLI's too), whose message says what to change; any other error keeps its
    traceback, a library's ValueError too (``refused_by_dayzero``)."""

    def receiver(*args: object, **kwargs: object) -> None:
        try:
            start(*args, **kwargs)
            return
        except REFUSED_FOR_GOOD as exc:
            log.error(
                "the %s worker cannot start: %s", stage, refusal_said(url, refused_for_good(url, exc) or str(exc))
            )
        except Exception as exc:
            if refused_by_dayzero(exc):  # (the pools' memory, the checkpoint, the settings of a group)
                log.error("the %s worker cannot start: %s", stage, exc)
            else:
                log.exception("the %s worker cannot start", stage)
        logging.shutdown()
        os._exit(REFUSED_EXIT)

    return receiver


def refused_by_dayzero(exc: BaseException) -> bool:
    """A ValueError dayzero's own code raised (its refusals' type: the message says what to change), not
    one a library raised under it (torch's, Triton's, the standard library's: a bug, its traceback says where)."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return isinstance(exc, ValueError) and frame is not None and frame.tb_frame.f_code.co_filename.startswith(OWN)


class Stage(Protocol):
    """What a worker process runs: a loop thread, and the jobs its Celery tasks hand it."""

    name: str
    stop: threading.Event
    grouped: bool  # other ranks follow its loop (a tensor-parallel group): a stop waits for the loop's end

    def run_forever(self) -> None: ...

    def handle(self, job: Any) -> None:
        """Admit ``job`` and return once it is settled (the task holds its ack until then)."""

    def snapshot(self) -> dict: ...

    def leave(self) -> None:
        """Stopping: out of the registry (``/ready``, metrics) while the jobs under way finish."""

    def stuck(self) -> bool:
        """A step has run past its bound, or the loop stalled between steps (its leases lapse): the
        worker is as good as frozen."""

    def hand_back(self, until: float) -> None:
        """Stopping, its loop ended: every request it holds goes to a live peer of the stage at once (not
        at its lease's lapse, after the grace), and the tasks waiting on them end; what it keeps for a
        peer to copy (prefill's handoffs) waits till ``until`` (monotonic) at most for the copy."""

    def close(self) -> None: ...


class StageWorker:
    """One stage for the life of a Celery worker process: ``build(name)`` runs when Celery starts
    (never at import), its loop on a thread; ``run`` is what the stage's task calls. ``reads``: the
    worker's queue reads (its Celery app's, ``QueueReads(app)``)."""

    def __init__(self, settings: Settings, stage: str, build: Callable[[str], Stage], reads: QueueReads) -> None:
        self.settings, self.stage, self._build, self.reads = settings, stage, build, reads
        self.running: Stage | None = None
        self._pulse: Pulse | None = None  # this process's liveness stamps (liveness.py), from before the load
        self._ready = threading.Event()
        self._loop: threading.Thread | None = None
        signals.worker_init.connect(exit_on_failure(self._start, stage, settings.redis_url), weak=False)
        signals.worker_shutting_down.connect(self._exit_soon, weak=False)
        signals.worker_ready.connect(_without_cancel_warning, weak=False)
        signals.worker_shutdown.connect(self._stop, weak=False)

    def _start(self, sender: object = None, **_: object) -> None:
        name = getattr(sender, "hostname", None) or self.stage  # celery's -n, e.g. "decode0@host"
        signal.signal(signal.SIGTERM, self._end_starting)  # Celery installs its own once started
        setup_tracing(self.settings, self.stage)
        if self.settings.trace_exporter != "none":  # only then: off, its signal handlers would still run per task
            CeleryInstrumentor().instrument()
        for logger in PER_TASK_LOGGERS:
            logging.getLogger(logger).setLevel(logging.WARNING)
        BrokerOutageFilter(log).install()  # Celery's reconnect lines: the first, then a line per period
        self._pulse = Pulse(connect(self.settings.redis_url), self.stage).start()  # a loading worker is not frozen
        running = self.running = self._build(name)
        self._pulse.watch(running.stuck)
        if self.settings.metrics_port:
            serve_metrics(self.settings.metrics_port, lambda: {running.name: running.snapshot()})
        self._pulse.ready()  # it serves its stage from now (the no-worker bound), before its loop announces it
        self._loop = threading.Thread(target=running.run_forever, name=f"{self.stage}-loop", daemon=True)
        self._loop.start()
        self._ready.set()
        log.info("%s ready", running.name)

    def _end_starting(self, signum: int, _frame: object) -> None:
        """SIGTERM before Celery's handler (loading the weights, warming up): end now, the pool
        segment unlinked (Python's default action left it, 256 MB by default, in /dev/shm until the
        next worker start on the host swept it) and this process out of the liveness stamps."""
        removed = unlink_own()
        log.warning("%s stopped while starting (SIGTERM); unlinked %s", self.stage, removed or "no pool segment")
        if self._pulse is not None:
            self._pulse.stop()
        logging.shutdown()
        os._exit(128 + signum)

    def _exit_soon(self, **_: object) -> None:
        """SIGTERM: Celery's warm shutdown waits for running tasks (whole generations) and, with
        Redis down, for a reconnect that may never come; end the process after the grace period
        whatever it waits for (unfinished requests' leases lapse and the reaper re-runs them)."""
        until = time.monotonic() + self.settings.shutdown_grace_s - CLOSE_MARGIN_S  # the hand back's end

        def exit_later() -> None:
            time.sleep(self.settings.shutdown_grace_s)
            log.warning("%s still stopping after %.0f s; exiting", self.stage, self.settings.shutdown_grace_s)
            try:
                self._stop()
                flush_spans()  # os._exit runs no exit handlers, where the SDK would export the last batch
            finally:  # (a failed clean-up: the process still ends)
                logging.shutdown()
                os._exit(0)

        threading.Thread(target=exit_later, name="exit-watchdog", daemon=True).start()
        if self._pulse is not None:
            self._pulse.stop()
            # Celery notices the stop once its consumer's queue read returns: a BRPOP blocked in Redis
            # up to 1 s (an idle worker's stop took ~1.0 s, ~0.3 s without it), which took the next
            # message pushed meanwhile (run by a worker on its way out, or pushed back by kombu).
            # Ended now, before it leaves the registry (nil: the read's timeout, to Celery).
            with contextlib.suppress(redis.RedisError):  # (Redis down: it ends with its poll)
                self.reads.end_now_or_next(self._pulse.r)
        if self.running is not None:  # (after the watchdog: Redis unreachable, leaving may wait its timeouts)
            self.running.leave()
            self._hand_back(until)

    def _hand_back(self, until: float) -> None:
        """The loop ends after its step under way (within ``LOOP_END_S``: a longer one is abandoned,
        what it writes after the hand back is stale), then the requests it held go to live peers at
        once (``Stage.hand_back``): their streams went on only after the grace, the lease's lapse and
        a sweep (~8 s), and the warm shutdown, its tasks ended with them, ends now (``until`` its peers
        have copied what it keeps for them)."""
        self.running.stop.set()
        if self._loop is not None:
            self._loop.join(LOOP_END_S)
        self.running.hand_back(until)

    def _stop(self, **_: object) -> None:
        """End the loop; a group's, waited for (within ``LOOP_END_S``): as it ends it tells the other
        ranks to stop (``LoopStage.run_forever``). The process ended right after (SIGTERM's watchdog,
        Redis gone) before the loop had told them: rank 1 took it for a failed group and exited 4.
        A one-rank worker's is not: its stop stays within the grace."""
        if self.running is not None:
            self.running.stop.set()
            if self.running.grouped and self._loop is not None and self._loop is not threading.current_thread():
                self._loop.join(LOOP_END_S)
            self.running.close()

    def run(self, job: Any) -> None:
        """Called by the Celery task: admit the job and wait until the stage settles it."""
        self._ready.wait()
        self.running.handle(job)


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
