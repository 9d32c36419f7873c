"""The order of the gateway's work when a token arrives: its stream's reader writes it to the client
before the hub sends its next read (that send is on nobody's way to the first token)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.records import Token, encode
from services.gateway.streams import StreamHub


def test_a_delivered_entry_s_reader_runs_before_the_hub_sends_its_next_read(redis_url):
    """The hub's reader task delivered an entry and went straight on to its next XREAD: building and
    sending it (redis-py's command machinery) ran before the subscriber's turn, inside every
    request's time to first token. Now the subscriber takes the entry before that read is sent."""
    stream, order = key("tokens", "turns"), []

    async def scenario() -> None:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=60_000)
        read = hub.r.xread

        async def recorded(*args, **kwargs):
            order.append("read sent")
            return await read(*args, **kwargs)

        hub.r.xread = recorded
        async with hub.subscribe("turns") as sub:

            async def client() -> None:
                order.append(f"token {(await sub.next(10)).text}")

            reader = asyncio.create_task(client())
            await asyncio.sleep(0.3)  # the hub's first read blocks in Redis
            await commands.xadd(stream, encode(Token("turns", 0, 5, "a")), id="1-0")
            async with asyncio.timeout(10):
                await reader
                while order.count("read sent") < 2:  # the hub reads on
                    await asyncio.sleep(0.01)
        async with asyncio.timeout(30):
            await hub.close()
        await commands.aclose()

    asyncio.run(scenario())
    assert order == ["read sent", "token a", "read sent"]
