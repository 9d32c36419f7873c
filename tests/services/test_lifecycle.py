"""The transitions against a real Redis: each is one round trip and leaves the keys it promises."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from dayzero.serving.lifecycle import Lifecycle, Watching, key


def test_claim_takes_a_free_request_once_and_lets_its_owner_claim_again(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.set(key("queued", "c1"), 1)
    assert store.claim("c1", "prefill0", 30)
    assert store.owner("c1") == "prefill0" and not store.r.exists(key("queued", "c1"))
    assert store.claim("c1", "prefill0", 30)  # the owner retries its batch
    store.r.set(key("queued", "c1"), 1)
    assert not store.claim("c1", "prefill1", 30)  # a live owner keeps it
    assert store.owner("c1") == "prefill0" and store.r.exists(key("queued", "c1"))


def test_claim_loads_its_script_again_after_a_flush(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.script_flush()  # what a restarted Redis has forgotten
    assert store.claim("c2", "prefill0", 30)


def test_watch_counts_readers_with_the_stream_ttl(redis_url):
    async def run() -> tuple[int, int, int]:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=60)
        await watching.watch("w1")
        await watching.watch("w1")
        count, ttl = int(await client.get(key("watchers", "w1"))), await client.ttl(key("watchers", "w1"))
        left = await watching.unwatch("w1")
        await client.aclose()
        return count, ttl, left

    count, ttl, left = asyncio.run(run())
    assert count == 2 and 0 < ttl <= 60 and left == 1
