"""The gateway: FastAPI app factory (REST + SSE) in front of the stage queues."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from dayzero.config import ModelConfig
from dayzero.redis_clients import sync_client
from dayzero.redis_refusals import CommandRefused, RefusedCredentials
from dayzero.serving import redis_clock as clock
from dayzero.serving.gateways import gone_after_s, stamp
from dayzero.serving.keys import QUEUES
from dayzero.serving.liveness import STAMP_RETRY_S, wake_stampers
from dayzero.serving.messages import PrefillJob
from dayzero.serving.metrics import QueueDepthCollector, SnapshotCollector
from dayzero.serving.no_worker_count import count_again, unserved_stages
from dayzero.serving.queue import STAGES, composer, make_celery
from dayzero.serving.reaper import OverdueWaits, end_unserved, sweep
from dayzero.serving.registry import Registry
from dayzero.serving.watching import cancel_left
from dayzero.settings import Settings
from dayzero.telemetry import flush_spans, setup_tracing
from dayzero.tokenizer import load_codec

from . import errors
from .bus import Bus
from .context import Gateway, system_fingerprint
from .metrics import CountResponses, GatewayMetrics
from .pass_steps import PassSteps
from .readiness import readiness
from .routes import answer_head_as_get, authorize, router
from .stopping import Stopping
from .tokenize_routes import tokenize_router

log = logging.getLogger("dayzero.gateway")
RERUN_TRANSIT_S = 30.0  # a re-run's mark until its message is pushed: a sweep's round trips, with room
START_CLOCK_S = 1.0  # the start, or a POST before it is known, waits this long at most for Redis's TIME
SCRAPE_REDIS_S = 1.0  # each of a scrape's two Redis reads gives up after this (Prometheus waits 5 s here)
# The workers' stamps after Redis's return come within a stamp's retry and its round trip: a stage a
# reaper pass first finds past its no-worker bound is looked at again this long after, and ends nothing before.
RESTAMPED_S = 2 * STAMP_RETRY_S


async def _reaper(gw: Gateway) -> None:
    """Re-run requests whose worker stopped heartbeating, end those waiting at a stage that no live
    worker has served for DAYZERO_NO_WORKER_TIMEOUT_S, or waiting anywhere in a queue past
    DAYZERO_TASK_TIME_LIMIT_S (see dayzero.serving.reaper); cancel those a stopped gateway's clients
    left and have not come back for within the grace (dayzero.serving.watching), once this gateway has
    run for a grace itself: a client of the only gateway cannot resume while it restarts, and a restart
    longer than the grace (4-6 s against 5 s under load) had their requests cancelled at its first pass,
    before they could come back. A pass that failed on Redis (down, frozen, refusing writes: no
    worker could stamp) begins the no-worker counts again at the next, those of the stages a worker
    served before the outage (no_worker_count.count_again). What waits at a stage ends ``no_worker``
    only at a pass that finds it past its bound after one that did too (none when that one failed),
    and the pass after one that first finds a stage so comes ``RESTAMPED_S`` later: a worker ready
    during an outage, at a stage none served before it, stamps within a retry of Redis's return, and
    a pass before that stamp took its stage for unserved (the outage in its count) and ended what
    waited there; the first pass after an outage the reaper saw (5 of 49 rounds), or the first after
    one wholly between two passes, which no pass saw fail. That pass wakes the workers whose stamps
    back off after a long refusal (liveness.wake_stampers): they stamp again before the next. Nothing
    is re-run for a lease after a failed pass (or one Redis answered a quarter lease late: frozen within
    the command timeout, it fails nothing): a live worker's lease that lapsed in the outage is its to
    take back (lease.py); re-run at once, each outage past a lease cost a re-prefill per request. Its start
    and each pass stamp this gateway among those on the Redis (dayzero.serving.gateways: alone, a cancel Redis
    refused goes at once); its other steps go on their own (pass_steps.py)."""
    messages = {stage: composer(gw.bus.celery, stage) for stage in ("vision", "prefill")}  # where re-runs start
    store = gw.bus.store
    overdue = OverdueWaits(store, gw.settings.task_time_limit_s, gw.codec)

    def send(job: PrefillJob, stage: str) -> None:
        store.enqueue(job.request.request_id, stage, messages[stage](job), gw.settings.visibility_timeout_s)

    def one_pass(past_before: set[str], rerun: bool, back_since: float) -> set[str]:
        """One pass; ``past_before``: the stages past the no-worker bound at the last one. -> those now.
        ``back_since``: when its passes came back from one that failed on Redis (gateways.stamp). The
        stamp goes last: as the pass's first command it took a frozen Redis's stall, the sweep's own
        read answered at once, and it re-ran a live worker's lease that lapsed in the freeze. A pass
        Redis answered with a refusal stamps too (an ACL's NOPERM at a step of every pass: the gateway
        serves on, a resume may come to it, and it never stamped; writes refused: nobody stamps)."""
        try:
            past = steps_of_a_pass(past_before, rerun)
        except redis.ResponseError:
            with contextlib.suppress(redis.RedisError):
                stamp(store.r, gw.bus.gateway, clock.now(), back_since, gone_after_s(period))
            raise
        stamp(store.r, gw.bus.gateway, clock.now(), back_since, gone_after_s(period))
        return set(past)

    def steps_of_a_pass(past_before: set[str], rerun: bool) -> dict[str, float]:
        if rerun:  # (Stalled: failed)
            steps.run("re-run", sweep, store, send, RERUN_TRANSIT_S, int(period * 900), 10 * period, period / 2)
        unserved, bound = unserved_stages(store.r, QUEUES), gw.settings.no_worker_timeout_s
        past = {stage: seconds for stage, seconds in unserved.items() if seconds > bound}
        if past.keys() - past_before:  # (looked at again RESTAMPED_S on: its workers backing off stamp now)
            wake_stampers(store.r)
        gw.bus.unserved = {stage: seconds for stage, seconds in past.items() if stage in past_before}  # (admission)
        steps.run("end of overdue waits", overdue.end)  # (first: the cancelled waits, an unserved stage's among them)
        steps.run("end of unserved waits", end_unserved, store, lambda stage: gw.bus.unserved.get(stage, 0.0), bound)
        if time.time() >= started + gw.settings.disconnect_grace_s:  # (left by a gateway that stopped)
            steps.run("cancel of left requests", cancel_left, store.r, store.ttl_s)
        return past

    period, started, steps = gw.settings.lease_s / 2, time.time(), PassSteps()
    refused = RefusedCredentials(gw.settings.credentials_refused_s, "gateway")  # (its passes: 503s for ever)
    command = CommandRefused(gw.settings.redis_url)  # (NOPERM: no exit, a restart meets the same ACL)
    failed_at = None  # when the first of the passes that failed on Redis failed (Redis's time; count_again)
    wait_s, past, rerun_from = period, set(), 0.0  # (the stages past the bound at the last pass; monotonic)
    back_since = clock.now()  # (Redis's time)
    # among the gateways at once (its first pass is a period away): meanwhile another gateway whose cancel
    # Redis refused took itself for the only one and cancelled at once what a resume here could take
    with contextlib.suppress(redis.RedisError):  # (Redis down or refusing writes: the passes stamp it)
        await run_in_threadpool(stamp, store.r, gw.bus.gateway, back_since, back_since, gone_after_s(period))
    while True:
        await asyncio.sleep(wait_s)
        try:
            if failed_at is not None:
                rerun_from = time.monotonic() + gw.settings.lease_s  # (the live workers beat within a lease)
                back_since = clock.now()
                await run_in_threadpool(count_again, store.r, QUEUES, failed_at)
            found = await run_in_threadpool(one_pass, past, time.monotonic() >= rerun_from, back_since)
            wait_s, past, failed_at = RESTAMPED_S if found - past else period, found, None
            refused.taken()
            command.taken()
        except redis.RedisError as exc:  # Redis down or refusing writes: /ready says so; sweep when it is back
            if not command.tried(exc):
                refused.tried(exc)  # (its credentials refused for DAYZERO_CREDENTIALS_REFUSED_S: the gateway exits 3)
            failed_at = clock.now() if failed_at is None else failed_at  # (its own pass counted before)
            wait_s, past = period, set()
            gw.bus.unserved = {}  # (admissions check no count until the next pass)
        except Exception:  # nobody awaits this task: ended, it would re-run and end nothing again
            wait_s = period
            log.exception("the reaper's pass failed; the next one runs in %.1f s", period)
        gw.command_refused = command.reason


async def _measure_clock(app: FastAPI) -> None:
    """This process's offset to Redis's clock (a TIME), which the admissions' stamps and the cancels'
    due times are on (redis_clock.py), waited for START_CLOCK_S at most (the TIME's answer still counts
    when it comes later); Redis down: measured by the next request, or reaper pass. One TIME at a
    time: a call while one is under way waits on that one (each sent its own, on the default
    executor's few threads: while Redis hung, 40 POSTs queued 40 TIMEs of 5 s each behind 6 threads)."""
    measuring = getattr(app.state, "measuring_clock", None)
    if measuring is None or measuring.done():
        measuring = asyncio.ensure_future(asyncio.to_thread(clock.sync, app.state.gateway.bus.store.r))
        measuring.add_done_callback(lambda done: done.cancelled() or done.exception())  # (its failure: said nowhere)
        app.state.measuring_clock = measuring
    with contextlib.suppress(redis.RedisError, TimeoutError):
        await asyncio.wait_for(asyncio.shield(measuring), START_CLOCK_S)


class ClockFirst:
    """A request that comes before the gateway knew its offset to Redis's clock (Redis was down at its
    start) measures it first: its admission was stamped with the host's clock, by a host 30 s ahead a
    request 30 s old, ended at once by a 30 s time limit. Nothing once it is known (every later
    request: one check), nor for a GET (/health, /ready: a probe while Redis hangs does not wait on it).
    Redis hung: the requests meanwhile wait on one TIME, START_CLOCK_S at most, and go on (to fail on
    Redis themselves); each waited for a TIME of its own, its 5 s timeout after those queued before it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not clock.known():  # (a probe: never waits)
            await _measure_clock(scope["app"])
        await self.app(scope, receive, send)


_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def _openapi_as_served(app: FastAPI, names: list[str]) -> None:
    """The OpenAPI schema as the gateway answers: the served model ids listed (clients and fuzzers
    see what is valid; validation still answers any other name with 400 model_not_found), and an
    invalid body's 400 with OpenAI's error body where FastAPI documents its own 422 (never sent),
    a path parameter's 404 too."""
    build = app.openapi

    def openapi() -> dict:
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for component in components.values():
            if "model" in component.get("properties", {}):
                component["properties"]["model"]["enum"] = names
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        components["Error"] = _ERROR
        answer = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                if responses.pop("422", None) is not None:
                    responses["400"] = {"description": "invalid request", **answer}
                if "{" in path:
                    responses["404"] = {"description": "not found", **answer}
        return schema

    app.openapi = openapi


def make_app(settings: Settings) -> FastAPI:
    setup_tracing(settings, "gateway")
    path = settings.checkpoint_dir()
    cfg = ModelConfig.from_file(path)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gw = Gateway(
            settings,
            Bus(settings, make_celery(settings)),
            load_codec(path),
            GatewayMetrics(),
            cfg.max_position_embeddings,
            cfg.vocab_size,
            cfg.raw.get("image_token_id") if "vision_config" in cfg.raw else None,
            cfg.eos_token_ids[0],
            vision_config=cfg.raw.get("vision_config") or {},
            fingerprint=system_fingerprint(cfg.raw),
        )
        if gw.codec.has_tokenizer:  # load the template renderer now, fail early
            gw.codec.chat_ids([{"role": "user", "content": "hi"}])
        else:
            log.warning("%s has no tokenizer.json: serving token-id prompts only", path)
        app.state.gateway = gw
        # the workers and the queues, read at each scrape on a client that gives up quickly: a scrape
        # while Redis hangs answers within Prometheus' timeout, with the gateway's own series
        timeout = {"socket_timeout": SCRAPE_REDIS_S, "socket_connect_timeout": SCRAPE_REDIS_S}
        scraped = Registry(sync_client(settings.redis_url, **timeout))
        gw.metrics.registry.register(SnapshotCollector(scraped.snapshots))
        gw.metrics.registry.register(QueueDepthCollector(lambda: scraped.queue_depths(STAGES)))
        if not settings.api_keys:
            log.warning("no API key configured (DAYZERO_API_KEYS): the gateway accepts every request")
        await _measure_clock(app)  # before the first request: its admission is on Redis's clock
        reaper = asyncio.create_task(_reaper(gw))
        await run_in_threadpool(lambda: None)  # anyio's backend and thread pool start on first use (~25 ms)
        yield
        reaper.cancel()
        await gw.bus.close()
        await run_in_threadpool(flush_spans)  # (the streams' spans have ended by now)

    app = FastAPI(
        title="dayzero",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible gateway of the dayzero pipeline",
    )
    errors.install(app)
    if settings.trace_exporter != "none":  # only then: off, its wrappers would still run on every message
        # no span per ASGI message: a stream would make one per chunk (per token), and export them all
        FastAPIInstrumentor.instrument_app(app, excluded_urls="health,ready,metrics", exclude_spans=["receive", "send"])
    app.add_middleware(errors.CatchAll)  # innermost of the three: its 500 is counted
    app.add_middleware(errors.BodyLimit, limit=settings.max_request_bytes)
    app.add_middleware(Stopping, drain_s=settings.shutdown_grace_s / 2)  # (outside BodyLimit: its body reads)
    app.add_middleware(CountResponses)
    app.add_middleware(ClockFirst)
    app.include_router(router)
    app.include_router(tokenize_router)
    _openapi_as_served(app, [settings.model_name])

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        body, status = await readiness(request.app.state.gateway)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", dependencies=[Depends(authorize)] if settings.metrics_auth else [])
    async def metrics(request: Request) -> Response:
        registry = request.app.state.gateway.metrics.registry
        return Response(await run_in_threadpool(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)

    answer_head_as_get(app.router)  # last: its own GET routes are in by now (the router's answer already)
    return app
