"""Request bodies parsed as JSON, with what is wrong and where when they cannot be: FastAPI's own
parse answered bytes that are not UTF-8, JSON nested past the parser's recursion, and an integer
longer than Python converts, with "There was an error parsing the body" and no position or reason
(its other JSON errors name the character)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

_STEP = np.zeros(256, np.int8)  # what each byte does to the nesting, outside strings
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1
_SCANNED_BYTES = 1 << 20  # the nesting scan's slice of the body (its arrays: ~8 bytes a byte)


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
    """Where ``text`` (JSON that failed to parse for its nesting) first opens a level past ``depth``.
    Everything before that bracket parsed, so it is JSON: a backslash is an escape's, in a string,
    and every escape but ``\\uXXXX`` (harmless: hex digits) is two bytes; blanked, the quotes left
    open and close strings. Vectorised over the body as UTF-8, a slice at a time: ~8 bytes of arrays
    a byte of the slice."""
    data = text.encode("utf-8", "surrogatepass")
    plain = np.frombuffer(data.replace(b"\\\\", b"__").replace(b'\\"', b"__"), np.uint8)
    level, in_string = 0, 0
    for start in range(0, len(plain), _SCANNED_BYTES):
        chunk = plain[start : start + _SCANNED_BYTES]
        quoted = np.bitwise_xor.accumulate((chunk == ord('"')).view(np.uint8)) ^ in_string  # 1: in a string
        steps = _STEP[chunk]
        steps[quoted.view(bool)] = 0
        levels = np.cumsum(steps, dtype=np.int32) + level
        if (past := np.flatnonzero(levels > depth)).size:  # [B] -> its character: the bytes that begin one
            return int(np.count_nonzero((np.frombuffer(data, np.uint8, start + past[0]) & 0xC0) != 0x80))
        level, in_string = int(levels[-1]), int(quoted[-1])
    return len(text)


def _loads(body: bytes) -> Any:
    """``json.loads`` with the cyclic garbage collector paused: each ~700 containers parsed set off a
    collection, of the whole heap now and then (8 MB of ``[1],`` held the event loop ~2.7 s, ~0.5 s
    paused). A thread would not free the loop: the C parser holds the GIL throughout."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return json.loads(body)
    finally:
        if paused:
            gc.enable()


async def parse(body: bytes) -> Any:
    try:
        return _loads(body)
    except UnicodeDecodeError as exc:
        raise _not_text(exc, body) from None
    except RecursionError:
        deepest = _deepest_parsed()  # (measured as _loads parses: one call below this one)
    except json.JSONDecodeError:
        raise  # (FastAPI's answer: what is wrong, at which character)
    except ValueError:  # (neither: an integer longer than Python converts, a guard against quadratic time)
        limit = sys.get_int_max_str_digits()
        raise HTTPException(
            400, f"the body has an integer of more than {limit} digits (the most this server parses)"
        ) from None
    # as the parse decoded it: UTF-8, -16 or -32 as its first bytes say (a lone surrogate's bytes pass)
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    where = await run_in_threadpool(_first_past, text, deepest)  # (numpy lets go of the GIL: off the loop)
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
