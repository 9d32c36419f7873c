"""A Redis that restarted under the gateway's stream reader (``streams.StreamHub``) between the read
it ended and the reader's next look: another server run (INFO's ``run_id``), which may hold none of
the open streams (it started empty: no persistence) or not all of them (a save older than them)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from dayzero.serving.keys import key

from .subscription import Subscription


class RedisRestarted(redis.ConnectionError):
    """Redis restarted without a request's record and stream: its stream ends as a lost Redis's does."""


async def run_id(r: aioredis.Redis) -> str | None:
    """The run of the Redis server ``r`` talks to: a new one after each restart. None: Redis refuses
    INFO (an ACL user without it), and answered nonetheless."""
    try:
        return (await r.info("server"))["run_id"]
    except redis.ResponseError:
        return None


async def not_held(r: aioredis.Redis, subs: list[Subscription]) -> list[Subscription]:
    """Of ``subs``, those whose request Redis no longer holds, neither its record nor its stream: no
    worker writes such a stream again (its lease went with the rest), and its reader would wait on
    keep-alives till its time limit. One round trip."""
    pipe = r.pipeline(transaction=False)
    for sub in subs:
        pipe.exists(key("req", sub.request_id), key("tokens", sub.request_id))
    return [sub for sub, held in zip(subs, await pipe.execute(), strict=True) if not held]
