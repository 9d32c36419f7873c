"""The gateways that share a Redis: each stamps itself in ``dz:gateways`` (a sorted set, gateway ->
Redis's unix time of its last stamp) as it starts and at each of its reaper's passes, and leaves it
when it stops. A leave whose cancel Redis refused asks whether another gateway runs
(services/gateway/leaving.py): only a resume there can be retrying a watch Redis refused too, which the cancel, deferred
DAYZERO_REFUSED_CANCEL_AFTER_S, waits for; alone on its Redis a gateway cancels at once (a lone
gateway on a Redis of the user's waited the 7 s: 360 tokens decoded for nobody against 54,
bench/refused_stream_cancel.py).

A gateway that died without leaving goes from the set once its stamp is ``gone_s`` old, counted
from no earlier than the stamping pass's return after an outage (``back_since``): nobody could stamp
while Redis refused writes or was down, and a live gateway's stamp from before a long outage, gone,
let a cancel overtake its resume's retried watch."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from .keys import key

# A gateway stamps each reaper pass (half a lease: 1.5 s by default); one whose stamp is this many
# passes old, and no less than GONE_MIN_S (a pass delayed by a loaded host, a slow Redis), is gone.
GONE_PASSES = 10
GONE_MIN_S = 15.0


def gone_after_s(period_s: float) -> float:
    """How old a gateway's stamp is once it is gone, for reaper passes ``period_s`` apart."""
    return max(GONE_PASSES * period_s, GONE_MIN_S)


def stamp(client: redis.Redis, gateway: str, now: float, back_since: float, gone_s: float) -> None:
    """``gateway`` runs at ``now`` (Redis's unix time); those whose stamp is older than ``gone_s``
    go, unless this gateway's passes came back from a failure less than ``gone_s`` ago
    (``back_since``): no stamp counts as older than that (theirs come within a pass)."""
    with client.pipeline() as pipe:
        pipe.zadd(key("gateways"), {gateway: now})
        if now - back_since > gone_s:
            pipe.zremrangebyscore(key("gateways"), "-inf", f"({now - gone_s!r}")
        pipe.execute()


async def forget(client: aioredis.Redis, gateway: str) -> None:
    """``gateway`` stops: it runs no more."""
    await client.zrem(key("gateways"), gateway)


async def others_run(client: aioredis.Redis, gateway: str) -> bool:
    """Another gateway than ``gateway`` shares this Redis (its stamp is in the set)."""
    return any(member.decode() != gateway for member in await client.zrange(key("gateways"), 0, 2))
