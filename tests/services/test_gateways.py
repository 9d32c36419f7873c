"""The gateways on a Redis (dayzero.serving.gateways), against a real Redis: a gateway that died
without leaving goes once its stamp is old, but not while the passes have just come back from an
outage (nobody could stamp then); a gateway that stops leaves at once."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from dayzero.serving.gateways import forget, others_run, stamp
from dayzero.serving.keys import key

GONE_S = 15.0


def test_a_gateway_whose_stamp_is_old_goes_unless_redis_just_came_back(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.delete(key("gateways"))
    r.zadd(key("gateways"), {"dead": 1000.0, "live": 1000.0 + GONE_S})
    stamp(r, "here", 1000.0 + GONE_S + 5, back_since=1000.0 + GONE_S, gone_s=GONE_S)  # (back 5 s ago)
    assert r.zrange(key("gateways"), 0, -1) == [b"dead", b"live", b"here"]
    stamp(r, "here", 1000.0 + 2 * GONE_S, back_since=1000.0, gone_s=GONE_S)
    assert r.zrange(key("gateways"), 0, -1) == [b"live", b"here"]


def test_a_gateway_sees_the_others_and_not_itself(redis_url):
    async def run() -> list[bool]:
        client = aioredis.Redis.from_url(redis_url)
        await client.delete(key("gateways"))
        seen = [await others_run(client, "here")]
        await client.zadd(key("gateways"), {"here": 1.0})
        seen.append(await others_run(client, "here"))
        await client.zadd(key("gateways"), {"there": 1.0})
        seen += [await others_run(client, "here"), await others_run(client, "there")]
        await forget(client, "there")
        seen.append(await others_run(client, "here"))
        await client.aclose()
        return seen

    assert asyncio.run(run()) == [False, False, True, True, False]
