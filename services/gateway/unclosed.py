"""Requests that ended (their ``done`` mark) with a stream their end could not be written to
(``Settled``'s UNCLOSED): the ends the gateway's stream reader (``streams.StreamHub``) gives their
readers instead, from the end SETTLE kept beside the mark (``unclosed``: its code, its usage)."""

from __future__ import annotations

import contextlib
import dataclasses

import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.records import Token, decode, ending

from .subscription import Subscription, entry_order


def _kept_end(request_id: str, index: int, reason: str, kept: dict | Exception) -> Token:
    """The end at ``index`` of a request that ended ``reason`` without its stream's end: the one its
    stage asked for, kept (``unclosed``); else (none given, or unreadable) one the reason alone names."""
    if kept and not isinstance(kept, Exception):
        with contextlib.suppress(KeyError, ValueError):  # (not an end's fields: the reason alone)
            return dataclasses.replace(decode(request_id, kept), index=index)
    message = "generation failed (how could not be recorded)" if reason == "error" else ""
    return ending(request_id, index, reason, message)


async def unclosed_ends(r: aioredis.Redis, quiet: list[Subscription]) -> list[tuple[Subscription, Token]]:
    """Of ``quiet``, those whose request ended (one MGET of their ``done`` marks) while their
    stream has no end, nor an entry they have not read (SETTLE writes both at once and nothing
    is appended after it: the stream stays so), each with the end SETTLE kept for it (its error's
    code, its usage: as the stream's end would have been), or else the one the mark names; at its
    stream's next index, no token, as SETTLE's own end. Only the ended cost a second round trip."""
    marks = await r.mget([key("done", sub.request_id) for sub in quiet])
    ended = [(sub, mark.decode()) for sub, mark in zip(quiet, marks, strict=True) if mark]
    if not ended:
        return []
    pipe = r.pipeline(transaction=False)
    for sub, _ in ended:
        pipe.xrevrange(key("tokens", sub.request_id), count=1)
        pipe.hgetall(key("unclosed", sub.request_id))
    answers = await pipe.execute(raise_on_error=False)
    ends = []
    for (sub, reason), last, kept in zip(ended, answers[::2], answers[1::2], strict=True):
        if isinstance(last, Exception):  # no stream: the read refuses it too, and ends it
            continue
        order = entry_order(last[0][0].decode()) if last else (0, 0)  # (an entry's: its index + 1)
        if last and (b"f" in last[0][1] or order > entry_order(sub.last)):
            continue  # its end is there, or entries it has yet to read: the read delivers them
        ends.append((sub, _kept_end(sub.request_id, order[0], reason, kept)))
    return ends
