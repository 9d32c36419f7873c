"""OpenAI-compatible routes: validate, submit to the prefill queue, stream the tokens back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from dayzero.serving.messages import GenerationRequest, SamplingSpec
from dayzero.telemetry import tracer

from .bus import Bus, TokenEvent
from .context import Gateway
from .errors import APIError
from .images import expand_placeholders, render_chat
from .schemas import ChatCompletionRequest, CompletionRequest, Sampling
from .shapes import Shape

router = APIRouter()
MAX_ECHO_LOGPROB_TOKENS = 32768  # the prompt's logprobs travel in one stream entry


def gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(gateway)]


async def authorize(gw: GatewayDep, authorization: Annotated[str | None, Header()] = None) -> None:
    keys = gw.settings.api_keys
    if keys and (authorization is None or authorization.removeprefix("Bearer ").strip() not in keys):
        raise APIError(401, "missing or invalid API key", "authentication_error", code="invalid_api_key")


Authorized = Depends(authorize)


def _spec(gw: Gateway, body: Sampling, prompt_ids: list[int], max_tokens: int | None) -> SamplingSpec:
    s = gw.settings
    if body.model != s.model_name:
        raise APIError(
            400,
            f"unknown model {body.model!r}; this server serves {s.model_name!r}",
            param="model",
            code="model_not_found",
        )
    limit = min(s.max_context, gw.max_positions)
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    if len(prompt_ids) >= limit:
        raise APIError(
            400,
            f"the prompt has {len(prompt_ids)} tokens; the context limit is {limit}",
            param="messages",
            code="context_length_exceeded",
        )
    if any(t < 0 or t >= gw.vocab_size for t in prompt_ids):
        raise APIError(400, f"prompt token ids must be in [0, {gw.vocab_size})", param="prompt")
    if max_tokens is not None and max_tokens > s.max_tokens_limit:
        raise APIError(400, f"max_tokens {max_tokens} exceeds the limit {s.max_tokens_limit}", param="max_tokens")
    if max_tokens is not None and len(prompt_ids) + max_tokens > limit:
        raise APIError(
            400,
            f"prompt ({len(prompt_ids)}) + max_tokens ({max_tokens}) exceeds the context limit {limit}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    default = min(s.max_tokens_limit, limit - len(prompt_ids))
    return SamplingSpec(
        max_tokens=max_tokens or default,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=body.stops(),
        ignore_eos=body.ignore_eos,
        logit_bias=_bias(gw, body),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logprobs=body.logprob_count(),
    )


def _bias(gw: Gateway, body: Sampling) -> dict[int, float]:
    bias = body.logit_bias or {}
    if any(not 0 <= t < gw.vocab_size for t in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {gw.vocab_size})", param="logit_bias")
    return bias


async def _admit(gw: GatewayDep, request: GenerationRequest, images: list[bytes]) -> None:
    stage = "vision" if images else "prefill"
    if await gw.bus.queue_depth(stage) >= gw.settings.max_queued:
        gw.metrics.rejected.inc()
        raise APIError(
            429,
            "too many queued requests; retry shortly",
            "rate_limit_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    await gw.bus.submit(request, images)


def _usage(event: TokenEvent) -> dict:
    u = event.usage or {"prompt_tokens": 0, "completion_tokens": event.index}
    return {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


async def _sse(
    gw: Gateway, request: GenerationRequest, after: str, first: bool, span: trace.Span | None = None
) -> AsyncIterator[ServerSentEvent]:
    shape = Shape(request, gw.settings.model_name, gw.codec, echoed=after != "0-0")  # a resumed stream: echoed
    rid, finished = request.request_id, False
    last_at, held = None, []  # held: tokens whose text (and logprobs) wait for the next chunk
    await gw.bus.watch(rid)
    try:
        if first:
            yield ServerSentEvent(data=json.dumps(shape.chunk(None, None, role=True)))
        async for event in gw.bus.events(rid, after):
            if event is None:
                yield ServerSentEvent(comment="keep-alive")
                continue
            now = time.time()
            if last_at is None and event.index == 0:
                gw.metrics.ttft.observe(now - request.created)
            elif last_at is not None:
                gw.metrics.itl.observe(now - last_at)
            last_at = now
            if event.finish_reason == "error":
                finished = True
                yield ServerSentEvent(
                    id=event.entry_id,
                    data=json.dumps({"error": {"message": event.error or "generation failed", "type": "server_error"}}),
                )
                break
            if event.finish_reason:
                finished = True
                gw.metrics.finished.labels(event.finish_reason).inc()
                gw.metrics.e2e.observe(now - request.created)
                chunk = shape.chunk(event.text, event.finish_reason, _usage(event), tokens=[*held, event])
                yield ServerSentEvent(id=event.entry_id, data=json.dumps(chunk))
                break
            held.append(event)
            if event.text:
                yield ServerSentEvent(id=event.entry_id, data=json.dumps(shape.chunk(event.text, None, tokens=held)))
                held = []
        yield ServerSentEvent(data="[DONE]")
    finally:
        if not finished:
            gw.metrics.disconnects.inc()
        with anyio.CancelScope(shield=True):  # the client is gone: the stream task is being cancelled
            await gw.bus.unwatch(rid, finished)
        if span is not None:
            span.set_attribute("dayzero.finished", finished)
            span.end()


async def _collect(gw: Gateway, request: GenerationRequest, http: Request) -> JSONResponse:
    shape, rid, events = Shape(request, gw.settings.model_name, gw.codec), request.request_id, []
    await gw.bus.watch(rid)
    finished = False
    try:
        async for event in gw.bus.events(rid):
            if event is None:
                if await http.is_disconnected():
                    break
                continue
            events.append(event)
            if event.finish_reason:
                finished = True
                if event.finish_reason == "error":
                    raise APIError(500, event.error or "generation failed", "server_error")
                gw.metrics.finished.labels(event.finish_reason).inc()
                gw.metrics.e2e.observe(time.time() - request.created)
                text = "".join(e.text for e in events)
                body = shape.body(text, event.finish_reason, _usage(event), events)
                return JSONResponse(body, headers={"X-Request-Id": rid})
    finally:
        with anyio.CancelScope(shield=True):
            await gw.bus.unwatch(rid, finished)
    raise APIError(499, "client disconnected", code="client_closed")


async def _respond(gw: Gateway, request: GenerationRequest, stream: bool, http: Request, images: list[bytes] = ()):
    """Submit, then answer: the ``gateway.request`` span covers the request until its stream ends."""
    span = tracer.start_span(
        "gateway.request",
        attributes={
            "dayzero.request_id": request.request_id,
            "dayzero.prompt_tokens": len(request.prompt_ids),
            "dayzero.images": request.images,
            "dayzero.stream": stream,
        },
    )
    try:
        with trace.use_span(span, end_on_exit=False):
            await _admit(gw, request, list(images))  # the queued job carries this span's context
    except Exception:
        span.end()
        raise
    if not stream:
        try:
            return await _collect(gw, request, http)
        finally:
            span.end()
    return EventSourceResponse(
        _sse(gw, request, "0-0", first=request.kind == "chat", span=span),
        ping=gw.settings.keepalive_s,
        headers={"X-Request-Id": request.request_id},
    )


def _new_request(ids: list[int], spec: SamplingSpec, kind: str, images: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=uuid.uuid4().hex, kind=kind, prompt_ids=tuple(ids), sampling=spec, created=time.time(), images=images
    )


@router.post("/v1/chat/completions", dependencies=[Authorized])
async def chat_completions(body: ChatCompletionRequest, gw: GatewayDep, http: Request):
    s = gw.settings
    prompt = render_chat(body.messages, s.image_limits(), s.patch_spec(), gw.image_token is not None)
    ids = gw.codec.encode(prompt.text)
    if prompt.images:
        ids = expand_placeholders(ids, gw.image_token, prompt.patches)
    spec = _spec(gw, body, ids, body.max_completion_tokens or body.max_tokens)
    return await _respond(gw, _new_request(ids, spec, "chat", len(prompt.images)), body.stream, http, prompt.images)


@router.post("/v1/completions", dependencies=[Authorized])
async def completions(body: CompletionRequest, gw: GatewayDep, http: Request):
    ids = gw.codec.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    spec = _spec(gw, body, ids, body.max_tokens)
    scored = body.echo and body.logprobs is not None
    if scored and len(ids) > MAX_ECHO_LOGPROB_TOKENS:
        limit = MAX_ECHO_LOGPROB_TOKENS
        raise APIError(400, f"echo with logprobs takes prompts of up to {limit} tokens", param="prompt")
    request = _new_request(ids, spec, "completion").model_copy(
        update={"echo": body.echo, "prompt_logprobs": body.logprobs if scored else None}
    )
    return await _respond(gw, request, body.stream, http)


@router.get("/v1/requests/{request_id}/stream", dependencies=[Authorized])
async def resume(request_id: str, gw: GatewayDep, last_event_id: Annotated[str | None, Header()] = None):
    request = gw.bus.store.request(request_id) if await gw.bus.known(request_id) else None
    if request is None:
        raise APIError(404, f"no request {request_id!r} (unknown or expired)", "not_found_error")
    after = last_event_id or "0-0"
    if not Bus.valid_entry_id(after):
        raise APIError(400, "Last-Event-ID must be a stream entry id like '12-0'", param="Last-Event-ID")
    first = after == "0-0" and request.kind == "chat"
    return EventSourceResponse(_sse(gw, request, after, first), ping=gw.settings.keepalive_s)


@router.get("/v1/models", dependencies=[Authorized])
async def models(gw: GatewayDep):
    return {
        "object": "list",
        "data": [
            {
                "id": gw.settings.model_name,
                "object": "model",
                "owned_by": "dayzero",
                "max_model_len": min(gw.settings.max_context, gw.max_positions),
                "eos_token_id": gw.eos_token,
                "images": gw.image_token is not None,
            }
        ],
    }
