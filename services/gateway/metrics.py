"""The gateway's Prometheus metrics (names follow the peers' ``*_time_to_first_token_seconds``)."""

from __future__ import annotations

import json
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .access_log import answering, name_answered

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        # no ``*_created`` series (each counter's and histogram's start time, one more series per labelled
        # child, a third of the scrape): nothing here reads them (rate() and increase() do not). The switch
        # is prometheus_client's, per process; the workers' collectors make none, and no process runs its
        # multiprocess mode.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "dayzero_time_to_first_token_seconds",
            "request accepted -> first token seen",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "dayzero_inter_token_latency_seconds", "gap between consecutive tokens", buckets=LATENCY_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "dayzero_e2e_request_latency_seconds", "request accepted -> finished", buckets=LATENCY_BUCKETS, registry=r
        )
        self.finished = Counter(
            "dayzero_requests_finished_total", "requests by finish reason", ["finish_reason"], registry=r
        )
        self.prompt_tokens = Counter(
            "dayzero_prompt_tokens_total", "prompt tokens of finished choices (usage)", registry=r
        )
        self.generation_tokens = Counter(
            "dayzero_generation_tokens_total", "completion tokens of finished choices (usage)", registry=r
        )
        self.responses = Counter("dayzero_http_responses_total", "API responses by status", ["status"], registry=r)
        self.rejected = Counter("dayzero_requests_rejected_total", "requests refused by admission control", registry=r)
        self.disconnects = Counter("dayzero_client_disconnects_total", "streams the client left early", registry=r)
        self.errors = Counter(
            "dayzero_request_errors_total",
            "errors sent to clients (error bodies, streams' error events) by their code (else their type)",
            ["code"],
            registry=r,
        )

    def error_sent(self, error: dict) -> None:
        """Count one error sent to a client: ``error`` is OpenAI's error object (``{"message", "type",
        "param", "code"}``). By its code, else its type (a validation 400 has none)."""
        self.errors.labels(str(error.get("code") or error.get("type") or "unknown")).inc()


def error_counter(app) -> Callable[[dict], None]:
    """Counts an error sent to a client on ``app``'s gateway metrics (``error_sent``), from outside
    its routes (the connection handler's 408s and 400s: deadline.py); none before the app has started."""

    def sent(error: dict) -> None:
        gateway = getattr(app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.error_sent(error)

    return sent


class CountResponses:
    """API responses by status (probes such as start-up ``/ready`` polls are not API traffic), and the
    error bodies among them by their code (``GatewayMetrics.error_sent``); the request ids each
    carries go to its access line (access_log.py).
    Plain ASGI: a streamed body goes straight through (BaseHTTPMiddleware would relay each chunk
    through a memory stream and a task of its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            answering()  # (a probe's line names none)
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        failed = False  # an error answer: its body (one message, a JSONResponse's) names the error

        async def counted(message: Message) -> None:
            nonlocal failed
            gateway = getattr(scope["app"].state, "gateway", None)
            if message["type"] == "http.response.start":
                name_answered(message)  # the ids it carries end its access line
            if message["type"] == "http.response.start" and gateway is not None:
                gateway.metrics.responses.labels(str(message["status"])).inc()
                failed = message["status"] >= 400
            elif message["type"] == "http.response.body" and failed and gateway is not None:
                failed = False
                gateway.metrics.error_sent(_error_of(message.get("body", b"")))
            await send(message)

        await self.app(scope, receive, counted)


def _error_of(body: bytes) -> dict:
    """The error object of an error answer's body ({} for one not in OpenAI's shape)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return {}
    return error if isinstance(error, dict) else {}
