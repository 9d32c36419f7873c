"""The gateways on a Redis (dayzero.serving.gateways), against a real Redis: a gateway that died
without leaving goes once its stamp is old, but not while the passes have just come back from an
outage (nobody could stamp then); a gateway that stops leaves at once; one that starts is among
them at once."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from dayzero.serving.gateways import forget, others_run, stamp
from dayzero.serving.keys import key

from .conftest import start_gateway_alone, wait_until
from .test_gateway_credentials_refused import _answers, _ready_reason, gateway_of_an_acl_user

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


def test_a_gateway_whose_user_an_acl_refuses_a_command_of_its_passes_still_stamps(tiny_checkpoint, tmp_path):
    """An ACL takes a command of the reaper's passes from the gateway's user (NOPERM on SMEMBERS, the
    end of overdue waits' read, at every pass): it serves on (a resume may come to it), but each pass
    ended at the refusal before its stamp, and another gateway found none: a cancel Redis refused
    there went at once under a resume here. Redis answered the pass: the gateway still stamps.
    Real processes: Redis and a gateway."""
    with gateway_of_an_acl_user(tiny_checkpoint, tmp_path, {}) as (server, grants, _, ready, log):
        assert wait_until(lambda: _answers(ready), 120), log.read_text()[-3000:]
        server.acl_setuser("dz", commands=["+@all", "-smembers"], **grants)
        assert wait_until(lambda: "user a command" in _ready_reason(ready), 30), log.read_text()[-3000:]
        server.delete(key("gateways"))
        assert wait_until(lambda: server.zcard(key("gateways")) == 1, 5), log.read_text()[-3000:]


def test_a_gateway_is_among_the_gateways_as_it_starts(demo_dir, tmp_path):
    """It stamped itself first at the end of its reaper's first pass (half a lease in: 1.5 s by
    default, 30 s here): meanwhile another gateway whose client left while Redis refused writes took
    itself for the only one, and cancelled at once a stream that a resume on this one could take.
    A real gateway and its Redis."""
    stack = start_gateway_alone(demo_dir, tmp_path, {"DAYZERO_LEASE_S": "60"})
    try:
        r = redis.Redis.from_url(stack.redis_url)
        assert wait_until(lambda: r.zcard(key("gateways")) == 1, 5), stack.log_tail("gateway")
    finally:
        stack.stop()
