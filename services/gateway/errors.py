"""OpenAI-style error bodies for every failure; no input produces a stack trace."""

from __future__ import annotations

import asyncio
import logging
import re

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dayzero.ids_only_codec import NoTokenizerError
from dayzero.serving.outage_log import LOGGED_EVERY_S, OutageLog

from .error_fields import field_path, param_path, specificity, tag_error, validation_code
from .error_text import shortened, validation_why
from .methods import methods_taken

QUEUE_UNAVAILABLE = "queue_unavailable"  # Redis unreachable, or refusing what the request needs
INVALID_JSON = "invalid_json"  # a body that does not parse (OpenAI's code is null; json_body's checks too)
log = logging.getLogger("dayzero.gateway")


def refusals(every_s: float = LOGGED_EVERY_S) -> OutageLog:
    """The 503s answered because Redis failed a request, in the log: the first with its reason, then
    one line per ``every_s`` at most, counting those answered since, the last ones too (a line per
    refused request, as many as the uvicorn access log's: 508 per gateway in the soak's 8 minutes of
    Redis outages; counted only into the next refusal's line, an outage's last ones went unsaid).
    ``failed(exc)`` on the event loop (its timer counts the last ones)."""
    return OutageLog(
        log,
        f"redis unavailable: %s; answering 503 {QUEUE_UNAVAILABLE}",
        f"%d more requests answered 503 {QUEUE_UNAVAILABLE} (Redis unavailable) since the last line",
        every_s=every_s,
        later=lambda delay_s, call: asyncio.get_running_loop().call_later(delay_s, call),
    )


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}


_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+")


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape (also the data of a stream's error event); no memory addresses, no
    number's thousands of digits."""
    return {"error": {"message": shortened(_ADDRESS.sub("", message)), "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        found = [tag_error(error) for error in exc.errors()] or [{"msg": "invalid request", "loc": ()}]
        first = max(found, key=specificity)
        if first.get("type") == "json_invalid":  # its location is a character, not a field
            where, why = first["loc"][-1], first.get("ctx", {}).get("error", "")
            message = f"the body is not valid JSON: {why} (at character {where})"
            return error_response(400, message, "invalid_request_error", code=INVALID_JSON)
        # a body left as bytes: FastAPI reads JSON only under a JSON content-type (a text/plain post
        # is one a browser page may send across origins unasked, so it stays unread)
        if isinstance(first.get("input"), bytes):
            sent = request.headers.get("content-type", "none")
            message = f"the body must be JSON sent with content-type: application/json (got {sent})"
            return error_response(400, message, "invalid_request_error", code="unsupported_content_type")
        param = param_path(field_path(first.get("loc", ()), exc.body)) or None
        why = validation_why(first)
        if param is None:  # the body's own (none: missing_required_parameter; not an object: invalid_type)
            message = _no_body(request) if first.get("type") == "missing" else why
            return error_response(400, message, "invalid_request_error", code=validation_code(first))
        return error_response(400, f"{param}: {why}", "invalid_request_error", param, validation_code(first))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message, headers, code = str(exc.detail), exc.headers, None
        if exc.status_code == 404:  # no route: OpenAI's words and type (Starlette's: "Not Found")
            message, code = f"Invalid URL ({request.method} {request.url.path})", "unknown_url"
        if exc.status_code == 405:  # OpenAI's words, and the methods it takes (Starlette's: "Method Not Allowed")
            taken = ", ".join(methods_taken(request.app.router.routes, request.scope))
            message = f"Invalid method for URL ({request.method} {request.url.path}): it takes {taken}"
            headers, code = {**(headers or {}), "Allow": taken}, "method_not_allowed"
        if exc.status_code == 400:  # the body's parse (json_body: not UTF-8, nested too deep, an endless integer)
            code = INVALID_JSON
        return error_response(exc.status_code, message, "invalid_request_error", code=code, headers=headers)

    @app.exception_handler(NoTokenizerError)
    async def no_tokenizer(_: Request, exc: NoTokenizerError) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error", code="no_tokenizer")

    refused = refusals()

    @app.exception_handler(redis.RedisError)
    async def unavailable(_: Request, exc: redis.RedisError) -> JSONResponse:
        refused.failed(exc)
        message = "the request queue is unavailable; retry shortly"  # (the code a stream's error event has too)
        return error_response(503, message, "service_unavailable", code=QUEUE_UNAVAILABLE, headers={"Retry-After": "1"})


class CatchAll:
    """The last resort, as plain ASGI inside CountResponses: an unexpected exception is logged and
    answered 500 in OpenAI's shape, and NOT re-raised. (An ``exception_handler(Exception)`` runs in
    Starlette's ServerErrorMiddleware, which re-raises after answering: uvicorn then drops the
    keep-alive connection, and the 500 never passes CountResponses.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("internal error answering %s %s", scope["method"], scope["path"])
            if started:  # too late to answer: the connection has to go
                raise
            await error_response(500, "internal error", "server_error")(scope, receive, send)


def _no_body(request: Request) -> str:
    """What an empty body is told: the fields the route's body needs (pydantic said "Field required")."""
    body = request.scope["route"].body_field.field_info.annotation
    needed = [field.alias or name for name, field in body.model_fields.items() if field.is_required()]
    either = " or ".join(getattr(body, "one_of", ()))  # (/tokenize's: messages or prompt)
    message = f"the request has no body: send a JSON object with {', '.join(needed)}"
    return f"{message}, and {either}" if either else message


def _codings(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The codings a request's Content-Encoding names but identity, in order: its lines are one
    list (RFC 9110 5.3; a gzip line followed by identity's was read as the last said)."""
    named = b",".join(value for name, value in headers if name == b"content-encoding").decode("latin-1")
    return [coding for part in named.split(",") if (coding := part.strip().lower()) not in ("", "identity")]


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request comes with a body: a length but 0, or chunked (RFC 9112 6.3: neither, none;
    a GET with a stray Content-Encoding was refused 415 for a body it never sent)."""
    named = dict(headers)
    return named.get(b"content-length", b"0").strip() != b"0" or b"transfer-encoding" in named


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, declared or chunked: the body is
    read (up to the limit) before the app sees it, so an oversized one never reaches a parser.
    A body sent compressed (``Content-Encoding``) is refused with 415 before it is read: nothing
    here decodes one, so gzip was parsed as it came ("the body is not UTF-8 ... byte 0x8b"), and
    a JSON body sent as br went through as if not compressed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if (codings := _codings(headers)) and _has_body(headers):
            message = f"the body is sent with content-encoding {', '.join(codings)!r}: send it uncompressed"
            answer = error_response(
                415,
                message,
                "invalid_request_error",
                code="unsupported_content_encoding",
                headers={"Accept-Encoding": "identity"},
            )  # (RFC 7694: the codings the server takes)
            await answer(scope, receive, send)
            return
        declared = dict(headers).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        buffered, seen = [], 0
        while not buffered or buffered[-1].get("more_body", False):
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break  # the client left
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(scope, receive, send)
                return

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()  # then disconnects, as they come

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, f"request body over {self.limit} bytes", "invalid_request_error", code="body_too_large"
        )
        await response(scope, receive, send)
