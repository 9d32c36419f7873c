"""Request bodies parsed as JSON, with what is wrong and where when they cannot be: FastAPI's own
parse answered bytes that are not UTF-8, and JSON nested past the parser's recursion, with "There
was an error parsing the body" and no position (its other JSON errors name the character)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _not_text(exc: UnicodeDecodeError, body: bytes) -> HTTPException:
    byte = exc.object[exc.start]
    # what comes before it decodes, as the parse decoded it (a lone surrogate's bytes pass)
    where = len(exc.object[: exc.start].decode(exc.encoding, "surrogatepass"))
    at_byte = exc.start + len(body) - len(exc.object)  # (the parse decoded what follows a byte order mark)
    what = f"{exc.reason} in the sequence that begins with byte 0x{byte:02x}"
    return HTTPException(400, f"the body is not {exc.encoding.upper()}: {what} (at character {where}, byte {at_byte})")


def _deepest_parsed() -> int:
    """The deepest nesting ``json.loads`` parses when called from the caller's frame (its C parser
    counts on Python's recursion limit, less the stack below it): 900-odd levels here."""
    low, high = 0, sys.getrecursionlimit()
    while low < high:
        mid = (low + high + 1) // 2
        try:
            json.loads("[" * mid + "]" * mid)
            low = mid
        except RecursionError:
            high = mid - 1
    return low


def _first_past(text: str, depth: int) -> int:
    """Where ``text`` (JSON that failed to parse for its nesting) first opens a level past ``depth``."""
    level = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        mark = token.group()
        if mark in "[{":
            level += 1
            if level > depth:
                return token.start()
        elif mark in "]}":
            level -= 1
    return len(text)


async def parse(body: bytes) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError as exc:
        raise _not_text(exc, body) from None
    except RecursionError:
        deepest = _deepest_parsed() + 1  # (measured one call deeper than the parse)
    # as the parse decoded it: UTF-8, -16 or -32 as its first bytes say (a lone surrogate's bytes pass)
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    # a Python loop, off the event loop (1.2 s of CPU for 8 MB of "[]," here; numpy's cumsum was no faster)
    where = await run_in_threadpool(_first_past, text, deepest)
    message = f"the body nests JSON deeper than this server parses ({deepest} levels; at character {where})"
    raise HTTPException(400, message)


class _ParsedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await parse(await self.body())
        return self._json


class ParsingRoute(APIRoute):
    """A route whose JSON body is parsed by ``parse`` (FastAPI's documented way to change how a
    route reads its request: a Request subclass)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def parsed(request: Request) -> Response:
            return await handle(_ParsedRequest(request.scope, request.receive, request._send))

        return parsed
