"""OpenAI-compatible routes: validate, submit to the prefill queue, stream the tokens back."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.routing import APIRoute
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from dayzero.chat import dsml
from dayzero.chat.encoding import continues_reasoning
from dayzero.params import Grammar, SamplingParams, sampler_seed
from dayzero.serving import redis_clock as clock
from dayzero.serving.messages import GenerationRequest

from .access import bearer, key_accepted, may_read
from .chat import check_tool_set, enforced, prompted
from .chat_schemas import ChatCompletionRequest, ChatPrompt
from .context import Gateway, encoded, tokenizing
from .error_fields import param_path
from .errors import APIError
from .images import expand_placeholders
from .json_body import ParsingRoute
from .responses import respond, resumed
from .schemas import CompletionRequest, Sampling
from .subscription import valid_entry_id

router = APIRouter(route_class=ParsingRoute)  # (bodies that are not JSON are told where)
MAX_ECHO_LOGPROB_TOKENS = 32768  # the prompt's logprobs travel in one stream entry


async def gateway(request: Request) -> Gateway:
    """The app's Gateway (async: FastAPI runs a plain ``def`` dependency on its thread pool, a thread
    hop per request)."""
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(gateway)]


async def authorize(gw: GatewayDep, authorization: Annotated[str | None, Header()] = None) -> None:
    keys = gw.settings.api_keys
    if keys and not key_accepted(bearer(authorization), keys):
        message, challenge = (
            "missing or invalid API key (send Authorization: Bearer KEY)",
            {"WWW-Authenticate": "Bearer"},
        )
        raise APIError(401, message, "authentication_error", code="invalid_api_key", headers=challenge)


Authorized = Depends(authorize)


def served(gw: Gateway, model: str) -> None:
    """A model this server does not serve is OpenAI's 404 model_not_found (vLLM's too): the openai
    client raises NotFoundError for it (a 400 raised BadRequestError). First in a route: before a
    prompt is rendered, its images decoded or its grammar compiled, for nothing."""
    if model != gw.settings.model_name:
        message = f"The model {model!r} does not exist; this server serves {gw.settings.model_name!r}"
        raise APIError(404, message, param="model", code="model_not_found")


def _spec(
    gw: Gateway,
    body: Sampling,
    prompt_ids: list[int],
    max_tokens: int | None,
    rule: Grammar | None = None,
    limit_param: str = "max_tokens",
) -> SamplingParams:
    """``limit_param``: the field ``max_tokens`` came from (chat's max_completion_tokens, or max_tokens)."""
    s = gw.settings
    limit = gw.context_limit
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt", code="invalid_value")
    within_context(gw, prompt_ids, "messages" if isinstance(body, ChatPrompt) else "prompt")
    if body.stops() and not gw.codec.has_tokenizer:
        raise APIError(
            400, "stop strings need text; this checkpoint has no tokenizer.json", param="stop", code="no_tokenizer"
        )
    if min(prompt_ids) < 0 or max(prompt_ids) >= gw.vocab_size:  # (2 M ids: 42 ms of CPU, 80 in a Python loop)
        raise APIError(400, f"prompt token ids must be in [0, {gw.vocab_size})", param="prompt", code="invalid_value")
    if max_tokens is not None and max_tokens > s.max_tokens_limit:
        message = f"{limit_param} {max_tokens} exceeds the limit {s.max_tokens_limit}"
        raise APIError(400, message, param=limit_param, code="invalid_value")  # OpenAI's code (it was null)
    if max_tokens is not None and len(prompt_ids) + max_tokens > limit:
        raise APIError(
            400,
            f"prompt ({len(prompt_ids)}) + {limit_param} ({max_tokens}) exceeds the context limit {limit}",
            param=limit_param,
            code="context_length_exceeded",
        )
    default = min(s.max_tokens_limit, limit - len(prompt_ids))
    return SamplingParams(
        max_tokens=max_tokens or default,
        temperature=0.0 if body.top_p == 0.0 else body.temperature,  # (greedy's token: what top_p 0 keeps,
        top_p=body.top_p or 1.0,  # sent so that a worker of the previous release, whose least was 1e-3, reads it)
        top_k=body.top_k,
        seed=None if body.seed is None else sampler_seed(body.seed),  # any int64 OpenAI takes, as a seed ours
        stop=body.stops(),
        ignore_eos=body.ignore_eos,
        logit_bias=tuple(sorted(_bias(gw, body).items())),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logprobs=body.logprob_count(),
        grammar=rule,
    )


def within_context(gw: Gateway, prompt_ids: list[int], param: str) -> None:
    """A prompt leaves room for a token of completion (else 400 naming ``param``)."""
    if len(prompt_ids) >= gw.context_limit:
        message = f"the prompt has {len(prompt_ids)} tokens; the context limit is {gw.context_limit}"
        raise APIError(400, message, param=param, code="context_length_exceeded")


def _bias(gw: Gateway, body: Sampling) -> dict[int, float]:
    bias = body.logit_bias or {}
    if any(not 0 <= t < gw.vocab_size for t in bias):
        raise APIError(
            400, f"logit_bias token ids must be in [0, {gw.vocab_size})", param="logit_bias", code="invalid_value"
        )
    return bias


def _new_request(ids: list[int], spec: SamplingParams, kind: str, images: int = 0, **fields) -> GenerationRequest:
    return GenerationRequest(
        request_id=uuid.uuid4().hex,
        kind=kind,
        prompt_ids=tuple(ids),
        sampling=spec,
        created=clock.now(),
        images=images,
        **fields,
    )


def _choices(requests: list[GenerationRequest], n: int) -> list[GenerationRequest]:
    """``n`` requests per prompt (choice ``p * n + j`` of prompt ``p``, all of one response: the
    first's id); a seeded choice ``j`` draws with seed + j (wrapping past MAX_SEED)."""
    if n == 1 and len(requests) == 1:
        return requests
    out = []
    for p, request in enumerate(requests):
        for j in range(n):
            seed = request.sampling.seed
            sampling = replace(request.sampling, seed=sampler_seed(seed + j) if seed is not None else None)
            update = {"request_id": uuid.uuid4().hex, "sampling": sampling, "prompt_index": p}
            out.append(request.model_copy(update=update))
    return [r.model_copy(update={"response_id": out[0].request_id, "choice": i}) for i, r in enumerate(out)]


@router.post("/v1/chat/completions", dependencies=[Authorized])
async def chat_completions(body: ChatCompletionRequest, gw: GatewayDep, http: Request):
    served(gw, body.model)
    thinking, _ = body.thinking()
    # a tool set or schema too big is refused in milliseconds, before it compiles or its text is rendered
    check_tool_set(gw, body)
    rule = await enforced(gw, body, thinking)
    ids, prompt = await prompted(gw, body)  # (images are decoded, long text tokenized: off the event loop)
    limit_param = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    spec = _spec(gw, body, ids, body.max_completion_tokens or body.max_tokens, rule, limit_param)
    protocol = {
        "thinking": continues_reasoning(prompt.messages, thinking),
        "tool_calls": bool(body.offered_tools()),
        "usage_in_stream": body.usage_in_stream(),
    }
    if protocol["tool_calls"] and spec.stop:  # stop strings end the reply's text, not its calls' markup
        spec = replace(spec, stop_bounds=dsml.OPENINGS)
    requests = _choices([_new_request(ids, spec, "chat", len(prompt.images), **protocol)], body.n)
    return await respond(gw, requests, body.stream, http, prompt.images)


@router.post("/v1/completions", dependencies=[Authorized])
async def completions(body: CompletionRequest, gw: GatewayDep, http: Request):
    served(gw, body.model)
    scored = body.echo and body.logprobs is not None
    rule = await enforced(gw, body)  # once for all prompts
    requests, prompts = [], body.prompts()
    for p, prompt in enumerate(prompts):
        with _named_prompt(p if len(prompts) > 1 else None):
            if isinstance(prompt, str):
                with tokenizing("prompt"):  # one far over the context: refused from its size
                    ids = await encoded(gw, prompt, gw.context_limit)
                if gw.image_token is not None:  # no images here: a placeholder typed into the text stands for none
                    ids = expand_placeholders(ids, gw.image_token, [], "prompt")
            else:
                ids = list(prompt)  # token ids are the client's own: taken as they are
            spec = _spec(gw, body, ids, body.max_tokens, rule)
            if scored and len(ids) > MAX_ECHO_LOGPROB_TOKENS:
                limit = MAX_ECHO_LOGPROB_TOKENS
                message = f"echo with logprobs takes prompts of up to {limit} tokens"
                raise APIError(400, message, param="prompt", code="unsupported_value")  # (a bound of ours, in context)
        echo = {"echo": body.echo, "prompt_logprobs": spec.logprobs if scored else None}
        echo["usage_in_stream"] = body.usage_in_stream()
        requests.append(_new_request(ids, spec, "completion", **echo))
    return await respond(gw, _choices(requests, body.n), body.stream, http)


@contextmanager
def _named_prompt(index: int | None) -> Iterator[None]:
    """A refusal of prompt ``index`` of several named as that prompt's (``prompt[3]``; None: the only one)."""
    try:
        yield
    except APIError as refused:
        if index is None or refused.param != "prompt":
            raise
        message, param = f"prompt {index}: {refused.message}", param_path(("prompt", index))
        raise APIError(refused.status, message, refused.type, param, refused.code, refused.headers) from None


@router.get("/v1/requests/{request_id}/stream", dependencies=[Authorized], response_class=EventSourceResponse)
async def resume(request_id: str, gw: GatewayDep, http: Request, last_event_id: Annotated[str | None, Header()] = None):
    """Only the key that created the request (without keys: its resume token) may read it. A resume
    holds its request's pending cancel until it reads (or is refused), however slowly Redis answers."""
    with gw.bus.leaving.coming(request_id):
        readable = await gw.bus.watching.known(request_id) and await may_read(gw, http, request_id)
        request = await run_in_threadpool(gw.bus.store.request, request_id) if readable else None
        if request is None:
            message = f"no stream of request {request_id!r} to read (unknown, expired, or answered in one body)"
            raise APIError(404, message, code="request_not_found")  # (OpenAI types its 404s invalid_request_error)
        after = last_event_id or "0-0"
        if not valid_entry_id(after):
            message = "Last-Event-ID must be a stream entry id like '12-0'"
            raise APIError(400, message, param="Last-Event-ID", code="invalid_value")
    return resumed(gw, request, after, {"X-Request-Id": request_id})


def _model_card(gw: Gateway) -> dict:
    return {
        "id": gw.settings.model_name,
        "object": "model",
        "created": gw.started,  # OpenAI's Model requires it: when this gateway began serving the model
        "owned_by": "dayzero",
        "max_model_len": gw.context_limit,
        "eos_token_id": gw.eos_token,
        "images": gw.image_token is not None,
    }


@router.get("/v1/models", dependencies=[Authorized])
async def models(gw: GatewayDep):
    return {"object": "list", "data": [_model_card(gw)]}


@router.get("/v1/models/{model:path}", dependencies=[Authorized])
async def model(model: str, gw: GatewayDep):
    served(gw, model)
    return _model_card(gw)


def answer_head_as_get(routes: APIRouter) -> None:
    """Each GET route answers HEAD too, as its GET (status, headers, dependencies: a key where GET
    asks for one) without the body (uvicorn sends none to a HEAD), as Starlette's own routes do
    (/docs, /openapi.json); FastAPI's answered 405 (uptime monitors probe /health with HEAD). Not an
    event stream's (a HEAD would open the stream): 405 with ``Allow: GET``. The twin is the route
    itself under another method, out of the OpenAPI schema. Once per router (at import for this one)."""
    for route in list(routes.routes):
        if isinstance(route, APIRoute) and "GET" in route.methods and route.response_class is not EventSourceResponse:
            head = copy.copy(route)
            head.methods, head.include_in_schema = {"HEAD"}, False
            routes.routes.append(head)


answer_head_as_get(router)
