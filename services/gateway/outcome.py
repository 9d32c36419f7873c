"""How a request's stream ends: latency metrics on the way, and every end that is not a finish
(a failure, a cancel, Redis lost, the server stopping) as an OpenAI-style error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import redis
from opentelemetry import trace

from dayzero.serving import redis_clock as clock
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.reaper import no_worker_message
from dayzero.serving.records import Token

from .context import Gateway
from .errors import QUEUE_UNAVAILABLE, APIError, error_body
from .subscription import Closed, Subscription

log = logging.getLogger("dayzero.gateway")


@dataclass
class Progress:
    """How far one request's stream has come: latency metrics (streamed or not) and its end."""

    gw: Gateway
    request: GenerationRequest
    span: trace.Span | None = None  # the request's gateway.request span: its first token is an event
    last_at: float | None = None
    over: bool = False  # finished, failed or cancelled: nothing left to cancel
    counted: bool = True  # its latencies and end go into the metrics (not a stream read again)
    ended: bool = False  # its end is in the metrics
    failed: bool = False  # its span's status says why it failed
    watcher: str = field(default_factory=lambda: uuid.uuid4().hex)  # this read among the stream's readers

    def see(self, event: Token) -> None:
        """Record ``event``; an end that is not a finish raises (APIError) after marking it over."""
        now, metrics = clock.now(), self.gw.metrics
        if event.finish_reason in ("error", "cancelled"):
            self.over = True
            failure = _failure(event, self.request)
            self.end(event.finish_reason, failure.message)
            raise failure
        if not self.counted:  # a stream read again: its latencies would be the replay's
            self.over = bool(event.finish_reason)
            return
        if self.last_at is None and event.index == 0:
            metrics.ttft.observe(now - self.request.created)
            if self.span is not None:
                self.span.add_event("first_token")
        elif self.last_at is not None:
            metrics.itl.observe(now - self.last_at)
        self.last_at = now
        if event.finish_reason:
            self.over = True
            self.end(event.finish_reason)
            metrics.e2e.observe(now - self.request.created)
            counts = usage(self.request, event)
            metrics.prompt_tokens.inc(counts["prompt_tokens"])
            metrics.generation_tokens.inc(counts["completion_tokens"])
            if self.span is not None:
                self.span.set_attribute("dayzero.completion_tokens", counts["completion_tokens"])

    def end(self, reason: str, message: str = "") -> None:
        """Count how this reader's request ended, once: its finish or failure as seen, or "error"
        when the reading itself failed (Redis lost, the server stopping, another choice failed).
        A failure or cancel sets its span's status (the first one: why it failed)."""
        if self.span is not None and reason in ("error", "cancelled") and not self.failed:
            self.failed = True
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, message or reason))
        if self.counted and not self.ended:
            self.ended = True
            self.gw.metrics.finished.labels(reason).inc()


def usage(request: GenerationRequest, event: Token) -> dict:
    """A finished request's token counts (its last event's; one without them, an end the gateway
    built from the request's ``done`` mark, counts its prompt and the tokens before it)."""
    u = event.usage or {"prompt_tokens": len(request.prompt_ids), "completion_tokens": event.index}
    return {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


@dataclass
class Usage:
    """The token counts of a response's finished choices; a prompt counts once, however many
    choices it has (``n`` > 1), and each prompt of a completions list counts, equal ones too.
    Thinking mode's reasoning tokens (part of the completion tokens) as OpenAI reports them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int | None = None  # None: no choice was in thinking mode
    choices: int = 0
    prompts: set[int] = field(default_factory=set)  # the prompt indices counted

    def add(self, request: GenerationRequest, last: Token) -> None:
        counts = usage(request, last)
        self.choices += 1
        self.completion_tokens += counts["completion_tokens"]
        if (details := counts.get("completion_tokens_details")) is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + details["reasoning_tokens"]
        if request.prompt_index not in self.prompts:
            self.prompts.add(request.prompt_index)
            self.prompt_tokens += counts["prompt_tokens"]

    def body(self) -> dict:
        counts = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        counts["total_tokens"] = self.prompt_tokens + self.completion_tokens
        if self.reasoning_tokens is not None:
            counts["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return counts


async def refuse_unserved(gw: Gateway, images: bool) -> None:
    """503 ``no_worker`` at once for a request a stage on its way has had no ready worker for past
    DAYZERO_NO_WORKER_TIMEOUT_S: queued, it would be ended at the reaper's next pass, its message left
    in the queue (nobody takes it) counting against DAYZERO_MAX_QUEUED (a 429 for the next ones)."""
    bound = gw.settings.no_worker_timeout_s
    unserved = await gw.bus.unserved_stage(("vision",) * images + ("prefill", "decode"), bound)
    if unserved is not None:
        message = no_worker_message(*unserved, bound)
        raise APIError(503, message, "service_unavailable", code="no_worker", headers={"Retry-After": "1"})


def refuse_unbounded(gw: Gateway) -> None:
    """503 at once while Redis refuses the reaper's user a command (NOPERM: /ready's reason): no pass
    ends a request past DAYZERO_NO_WORKER_TIMEOUT_S or the task time limit, and one that no worker
    took waited for ever; the streams already open are served on. The client is told no more than of a
    Redis that fails (errors.py): the reason, /ready's and the log's, names the Redis user, its ACL and
    the setting (it was this answer's message, to every client)."""
    if gw.command_refused is not None:
        message = "the request queue is unavailable on this gateway; retry on another"
        raise APIError(503, message, "service_unavailable", code=QUEUE_UNAVAILABLE, headers={"Retry-After": "1"})


def _failure(event: Token, request: GenerationRequest) -> APIError:
    if event.code in ("no_worker", "overloaded"):  # no worker took it, or none had room in time: not its fault
        return APIError(503, event.error, "service_unavailable", code=event.code, headers={"Retry-After": "1"})
    if event.code == "grammar_failed":  # the request's schema past a limit of llguidance, found mid-reply (guided.py)
        param = request.sampling.grammar.param if request.sampling.grammar else None
        return APIError(400, f"cannot enforce this schema: {event.error}", param=param, code=event.code)
    if event.finish_reason == "error":
        return APIError(500, event.error or "generation failed", "server_error", code="generation_failed")
    message = "the request was cancelled before it finished"
    return APIError(503, message, "service_unavailable", code="cancelled", headers={"Retry-After": "1"})


def stream_error(exc: Exception, rid: str) -> dict:
    """The data of the error event that ends request ``rid``'s stream abnormally."""
    if isinstance(exc, APIError):
        return error_body(exc.message, exc.type, exc.param, exc.code)
    if isinstance(exc, redis.RedisError):
        message = "the request queue became unavailable before the request finished; retry"
        return error_body(message, "service_unavailable", code=QUEUE_UNAVAILABLE)
    if isinstance(exc, Closed):
        return error_body("the server is shutting down; retry", "service_unavailable", code="shutting_down")
    log.error("the stream of request %s failed", rid, exc_info=exc)
    return error_body("internal error", "server_error")


@contextlib.asynccontextmanager
async def closing(sub: Subscription, shutdown: anyio.Event | None) -> AsyncIterator[None]:
    """End ``sub`` when the server starts shutting down (sse-starlette sets ``shutdown``)."""

    async def relay() -> None:
        await shutdown.wait()
        sub.close(Closed())

    task = asyncio.create_task(relay()) if shutdown is not None else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
