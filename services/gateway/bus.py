"""The gateway's side of the queue: submit requests, read token streams, cancel (``leaving``), check readiness."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable

import redis
import redis.asyncio as aioredis
from celery import Celery
from opentelemetry import trace
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from starlette.concurrency import run_in_threadpool

from dayzero.redis_clients import async_client
from dayzero.serving.admission import Queue, Record
from dayzero.serving.gateways import forget
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, prefill_job_json
from dayzero.serving.no_worker_count import unserved_for
from dayzero.serving.queue import TaskMessages
from dayzero.serving.registry import Registry
from dayzero.serving.watching import Watching
from dayzero.settings import Settings
from dayzero.telemetry import carrier

from .held_loop import CONNECT_S, HeldLoopConnect
from .leaving import Leaving
from .streams import StreamHub

FORGET_S = 1.0  # a stopping gateway's leave of the gateways on its Redis waits no longer (down, frozen)


def command_client(settings: Settings) -> aioredis.Redis:
    """The gateway's client for short commands (token streams go through the hub): a bounded pool that
    waits, never fails; a command on a connection Redis closed goes once more, a connect the event
    loop timed out is made once more (``HeldLoopConnect``)."""
    return async_client(
        settings.redis_url,
        blocking=True,
        max_connections=64,
        timeout=10,
        socket_connect_timeout=CONNECT_S,
        socket_timeout=settings.gateway_redis_timeout_s,  # (a frozen Redis: the command fails, 503 or tried again)
        connection_mixin=HeldLoopConnect,
        retry=Retry(NoBackoff(), 1, (redis.ConnectionError,)),  # (a TimeoutError: a frozen Redis, not tried again)
    )


class Bus:
    def __init__(self, settings: Settings, celery: Celery) -> None:
        self.settings, self.celery = settings, celery
        # Celery builds its message machinery on first use (~3.5 ms): here, not in the first request
        self.messages = {stage: TaskMessages(celery, stage) for stage in ("vision", "prefill")}
        self.r = command_client(settings)
        block_ms, margin_s = int(settings.keepalive_s * 1000), settings.gateway_redis_timeout_s  # (its reads' bound)
        self.hub = StreamHub(settings.redis_url, self.r, block_ms=block_ms, read_margin_s=margin_s)
        self.watching = Watching(self.r, settings.stream_ttl_s, settings.visibility_timeout_s)
        self.store = Lifecycle.connect(settings.redis_url, settings.stream_ttl_s)  # sync, for the thread pool
        self.registry = Registry(self.store.r)
        self.gateway = uuid.uuid4().hex  # among those on the Redis (its reaper stamps it: dayzero.serving.gateways)
        self.leaving = Leaving(
            self.watching,
            self.gateway,
            settings.disconnect_grace_s,
            settings.task_time_limit_s,
            settings.refused_cancel_after_s,
        )
        self.unserved: dict[str, float] = {}  # stages past the no-worker bound at the reaper's last pass

    async def submit(
        self,
        requests: list[GenerationRequest],
        spans: list[trace.Span],
        images: list[bytes],
        owner: str,
        watchers: list[str],
    ) -> bool:
        """Record the requests (their images' bytes, the digest of who may read their streams, their
        responses' reads: ``watchers``, one each) and queue them, vision first when they have
        images, in one round trip and no thread (``send_task`` would take one, and a round trip
        each); or none of them, False, when the stage's queue would hold more than ``max_queued``.
        Each request (recorded and queued) carries its span's context; it is serialized once."""
        stage, messages, records = "vision" if images else "prefill", [], []
        for request, span, watcher in zip(requests, spans, watchers, strict=True):
            with trace.use_span(span, end_on_exit=False):
                context = carrier()
            # recorded with its span's context (a re-run continues it), its message from the same JSON
            records.append(Record.of(request.model_copy(update={"trace": context}), watcher))
            messages.append(self.messages[stage](prefill_job_json(records[-1].json), context))
        queue = Queue(stage, tuple(messages), self.settings.max_queued)
        return await self.watching.admit(records, images, owner, queue)

    async def unserved_stage(self, stages: tuple[str, ...], bound_s: float) -> tuple[str, float] | None:
        """The first of ``stages`` without a ready worker for over ``bound_s`` (-> it, for how long),
        read again only for a stage the reaper's last pass found so: a served stage costs nothing."""
        for stage in [stage for stage in stages if stage in self.unserved]:
            unserved_s = await run_in_threadpool(unserved_for, self.store.r, stage)
            if unserved_s > bound_s:
                return stage, unserved_s
            self.unserved.pop(stage, None)
        return None

    # -- readiness -------------------------------------------------------------------------------------
    async def live_workers(self, extra_stages: tuple[str, ...] = ()) -> dict[str, list[str]]:
        """Each stage's live worker processes (``extra_stages`` first: vision for a checkpoint with images)."""
        await self.r.ping()
        return {
            stage: await run_in_threadpool(self.registry.live_workers, stage, 3 * self.settings.lease_s + 2)
            for stage in (*extra_stages, "prefill", "decode")
        }

    async def close(self, stamped: Awaitable | None = None) -> None:
        """Stop reading streams; requests nobody reads any more are cancelled, at their grace's end when
        their clients may resume them (by whichever gateway runs then). The leave of the gateways waits for
        ``stamped`` (the reaper's stamp in flight: landed after, it counted this gateway on), nothing else."""
        await self.hub.close()
        await self.leaving.close()
        if stamped is not None:
            await stamped
        with contextlib.suppress(redis.RedisError, TimeoutError):  # (else its stamp goes once old: gateways.py)
            await asyncio.wait_for(forget(self.r, self.gateway), FORGET_S)
        await self.r.aclose()
