"""The gateway: FastAPI app factory (REST + SSE) in front of the stage queues."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import redis
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from dayzero.config import ModelConfig, context_limit
from dayzero.redis_clients import sync_client
from dayzero.serving import redis_clock as clock
from dayzero.serving.metrics import QueueDepthCollector, SnapshotCollector
from dayzero.serving.queue import STAGES, make_celery
from dayzero.serving.registry import Registry
from dayzero.settings import Settings
from dayzero.telemetry import flush_spans, setup_tracing
from dayzero.tokenizer import load_codec

from . import errors
from .bus import Bus
from .context import Gateway, system_fingerprint
from .metrics import CountResponses, GatewayMetrics
from .readiness import readiness
from .reaping import reap
from .routes import answer_head_as_get, authorize, router
from .stopping import Stopping
from .tokenize_routes import tokenize_router

log = logging.getLogger("dayzero.gateway")
START_CLOCK_S = 1.0  # the start, or a POST before it is known, waits this long at most for Redis's TIME
REAPER_END_S = 5.0  # a stop waits no longer for the reaper's pass in flight (a frozen Redis: its stamp goes once old)
SCRAPE_REDIS_S = 1.0  # each of a scrape's two Redis reads gives up after this (Prometheus waits 5 s here)


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
    see what is valid; the routes still answer any other name with 404 model_not_found), and an
    invalid body's 400 with OpenAI's error body where FastAPI documents its own 422 (never sent),
    a 404 where a path parameter or the body names what may not be there (a model)."""
    build = app.openapi

    def openapi() -> dict:
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        modelled = set()  # the bodies that name a model
        for name, component in components.items():
            if "model" in component.get("properties", {}):
                component["properties"]["model"]["enum"] = names
                modelled.add(f"#/components/schemas/{name}")
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        components["Error"] = _ERROR
        answer = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                if responses.pop("422", None) is not None:
                    responses["400"] = {"description": "invalid request", **answer}
                if "{" in path or _body_schema(operation).get("$ref") in modelled:
                    responses["404"] = {"description": "not found", **answer}
        return schema

    app.openapi = openapi


def _body_schema(operation: dict) -> dict:
    """The schema of an operation's JSON body ({} for one that takes none)."""
    return operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})


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
            context_limit(cfg, settings.max_context),
            cfg.vocab_size,
            cfg.raw.get("image_token_id") if "vision_config" in cfg.raw else None,
            cfg.eos_token_ids[0],
            vision_config=cfg.raw.get("vision_config") or {},
            fingerprint=system_fingerprint(cfg.raw, settings.speculative_tokens),
        )
        if gw.codec.has_tokenizer:  # load the template renderer now, fail early
            gw.codec.chat_ids([{"role": "user", "content": "hi"}])
            gw.codec.shown(0)  # its id set, now: on a first logprobs request it walked the vocabulary
            # on the loop every stream shares (~0.3 s at 129k ids)
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
        reaper = asyncio.create_task(reap(gw))
        await run_in_threadpool(lambda: None)  # anyio's backend and thread pool start on first use (~25 ms)
        yield
        reaper.cancel()  # its stamp in flight (a thread's) lands first: after the leave, it counted the gateway on
        reaped = asyncio.ensure_future(asyncio.wait({reaper}, timeout=REAPER_END_S))  # (the streams end meanwhile)
        await gw.bus.close(stamped=reaped)  # (leaves the gateways on the Redis)
        await run_in_threadpool(flush_spans)  # (the streams' spans have ended by now)

    app = FastAPI(
        title="dayzero",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible gateway of the dayzero pipeline",
        redirect_slashes=False,  # /health/ is no route (OpenAI's 404), not a 307 to /health
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
