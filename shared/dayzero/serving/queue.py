"""The one Celery app: a queue per stage, Redis broker, late acks, prefetch 1; its task messages."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable

from celery import Celery
from pydantic import BaseModel

from ..settings import Settings
from ..telemetry import carrier
from .broker import celery_broker
from .reconnect import CONSUMER, CREDENTIALS_REFUSED_S, HANG_BOUNDS, RETRY_INTERVALS

STAGES = ("vision", "prefill", "decode")
TASKS = {stage: f"dayzero.{stage}" for stage in STAGES}
_PROBE_ID = "dayzero-probe-task-id"  # the id of the message TaskMessages has Celery build


def make_celery(settings: Settings) -> Celery:
    app = Celery("dayzero")
    transport_options = {
        "visibility_timeout": settings.visibility_timeout_s,
        "ack_emulation": False,
        **RETRY_INTERVALS,  # the consumer's tries to connect again: a second apart at most (reconnect.py)
        **HANG_BOUNDS,  # a Redis frozen or unreachable: its connects, commands, queue reads bounded (reconnect.py)
    }
    app.conf.update(
        # kombu's Redis transport, consuming on through a Redis turned replica or refusing writes (broker.py)
        **celery_broker(settings.redis_url, transport_options),
        task_routes={name: {"queue": stage} for stage, name in TASKS.items()},
        task_serializer="json",  # messages are data: never a pickle off the broker
        accept_content=["json"],
        task_acks_late=True,  # acked when its request is finished: the worker's prefetch counts it till then
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # decode's: lowered while what it handed back waits for room (room.py)
        task_time_limit=settings.task_time_limit_s,
        # no ack emulation: kombu's unacked-message bookkeeping in Redis cost a MULTI per message
        # (~2 ms of every request's queue hop here) and, when Redis restarts under a worker with a
        # task in flight, crashes its consumer while restoring them ("Unrecoverable error"; the
        # process then waits for its running generations before it exits: ~48 s of a decode stage
        # taking no work). A dead worker's requests come back through their lapsed leases (reaper.py),
        # an unclaimed message's through its lapsed queued mark, as before.
        worker_consumer=CONSUMER,
        **{CREDENTIALS_REFUSED_S: settings.credentials_refused_s},  # (its consumer exits past it: reconnect.py)
        broker_connection_retry_on_startup=True,
        # tried for as long as Redis is out: Celery's 100 tries, a second apart, ended the worker
        # ("Unrecoverable error") after a 100 s outage (at kombu's default intervals: ~47 min)
        broker_connection_max_retries=None,
        # a lost connection leaves the tasks running (broker.QoS); Celery 6's default would cancel them
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_ignore_result=True,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
    )
    return app


class TaskMessages:
    """A stage's broker messages as ``send_task`` writes them, a payload (its task's one argument)
    each: Celery's task protocol 2 in kombu's Redis envelope, for an LPUSH onto the stage's list
    (the default exchange: the list is the queue). Celery builds the first one; the others are that
    one with their own ids and payload (``as_task_v2`` per message cost ~25 us of each admission's
    and each handoff's CPU: the headers but the ids are the same for every message of a process)."""

    def __init__(self, app: Celery, stage: str) -> None:
        probe = app.amqp.as_task_v2(_PROBE_ID, TASKS[stage], args=[""], argsrepr="")
        self._headers = dict(probe.headers)
        self._properties = {
            **probe.properties,
            "delivery_mode": 2,  # persistent
            "delivery_info": {"exchange": "", "routing_key": stage},
            "priority": 0,
            "body_encoding": "base64",
        }
        # the fields that carry the task's id (id, root_id, correlation_id): each message's own
        self._ids = [k for k, v in self._headers.items() if v == _PROBE_ID]
        self._property_ids = [k for k, v in self._properties.items() if v == _PROBE_ID]
        self._rest = list(probe.body[1:])  # (args), kwargs, embed

    def __call__(self, payload: str, headers: dict[str, str]) -> str:
        """The message of ``payload``; ``headers``: extra message headers (the trace context, which
        Celery's instrumentation reads on the worker)."""
        task_id = str(uuid.uuid4())
        properties = {**self._properties, **dict.fromkeys(self._property_ids, task_id)}
        properties["delivery_tag"] = str(uuid.uuid4())
        own = {**dict.fromkeys(self._ids, task_id), "argsrepr": f"<{len(payload)} bytes>"}
        return json.dumps(
            {
                "body": base64.b64encode(json.dumps([[payload], *self._rest]).encode()).decode(),
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": {**self._headers, **own, **headers},
                "properties": properties,
            }
        )


def composer(app: Celery, stage: str) -> Callable[[BaseModel], str]:
    """A job -> the stage's task message (``TaskMessages``) for it, the current span's context in its
    headers, for a caller that pushes it with the request's marks in one step (Lifecycle's hand_off,
    enqueue): one LPUSH where ``send_task`` would take kombu's producer, its own connections, ~1.5 ms
    of a worker's CPU and several round trips."""
    messages = TaskMessages(app, stage)

    def compose(job: BaseModel) -> str:
        return messages(job.model_dump_json(), carrier())

    return compose


def rerun_messages(app: Celery) -> dict[str, Callable[[BaseModel], str]]:
    """Where a re-run starts (vision with images, else prefill): each stage's job -> its message."""
    return {stage: composer(app, stage) for stage in ("vision", "prefill")}
