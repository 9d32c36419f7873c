"""The gateway's connects to Redis are bounded (2 s) by a timer on its event loop. A loop held past the
bound (a burst of requests parsed on a starved host) found the connect answered and its timer due at
once, and ran the timer first: a connect Redis had answered in a millisecond failed ("Timeout
connecting to server"), and the request waiting on it got 503 ``queue_unavailable`` while Redis served
every other (test_256_concurrent_streams_each_complete_or_get_429, CI at load ~12). The commands'
client connects once more then (``bus.command_client``); a connect timed out on time
(an unreachable Redis) does not (test_partitioned_cancel.py)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis

from dayzero.settings import Settings
from services.gateway.bus import command_client
from services.gateway.held_loop import CONNECT_S, CONNECT_TIMED_OUT, HeldLoopRetry
from services.gateway.restarts import run_id
from services.gateway.streams import StreamHub

from .sentinel_group import MASTER_NAME, sentinel_group

HELD_S = 2.25  # the loop held past the connect's bound (2 s), less than its bound and the old lateness (0.5 s)


def test_a_connect_timed_out_by_a_held_event_loop_is_made_again(redis_url):
    async def ping_with_the_loop_held() -> bool:
        client = command_client(Settings(redis_url=redis_url))
        try:
            ping = asyncio.create_task(client.ping())
            await asyncio.sleep(0)  # the ping's first wait: its connect, under the connect's timer
            time.sleep(HELD_S)  # the loop held (as by other requests' work): the answer and the timer both due
            return await ping
        finally:
            await client.aclose()

    assert asyncio.run(ping_with_the_loop_held()) is True


def test_the_stream_readers_connect_timed_out_by_a_held_event_loop_ends_no_stream(redis_url):
    """The hub's reader connects again when its streams resume after its connection closed (Redis's
    idle ``timeout``, a restart): the same held loop ended every open stream there (a TimeoutError
    is a lost Redis: streams.py), where the read, its connect made again, goes on."""

    async def subscribed_after_the_hold() -> bool:
        commands = command_client(Settings(redis_url=redis_url))
        hub = StreamHub(redis_url, commands, block_ms=200)
        hub.run_id = await run_id(commands)  # a reader ran before: the next one asks nothing first
        try:
            async with hub.subscribe("held-loop") as sub:
                await asyncio.sleep(0)  # the reader's first wait: its read's connect, under the connect's timer
                time.sleep(HELD_S)  # the loop held: the answer and the timer both due
                await asyncio.sleep(0.5)  # the reader goes on: a read, or the streams ended
                return sub in hub.subs
        finally:
            await hub.close()
            await commands.aclose()

    assert asyncio.run(subscribed_after_the_hold()) is True


def test_a_connect_made_again_that_times_out_on_time_is_not_made_a_third_time():
    """A command's try reconnects inside the connect's own tries (redis-py nests them), and the
    command's retry judged the connect its inner retry had made again by the first's hold: an
    unreachable Redis, met by a held loop, cost a third connect (its bound more)."""
    connects = 0

    async def connect() -> None:
        nonlocal connects
        connects += 1
        if connects == 1:
            asyncio.get_running_loop().call_soon(time.sleep, HELD_S)  # the loop held past the connect's bound
        await asyncio.sleep(CONNECT_S)  # Redis unreachable: the connect's timer runs (late, the first)
        raise redis.TimeoutError(CONNECT_TIMED_OUT)

    async def command() -> None:
        retry = HeldLoopRetry(closed=True)
        connecting = lambda: retry.call_with_retry(connect, lambda error: asyncio.sleep(0))
        await retry.call_with_retry(connecting, lambda error: asyncio.sleep(0))

    with pytest.raises(redis.TimeoutError):
        asyncio.run(command())
    assert connects == 2


def test_a_sentinel_connection_s_connect_timed_out_by_a_held_event_loop_is_made_again(tmp_path):
    """A sentinel connection's try asks the sentinels before it connects to the master: the first one
    unreachable (here: its connect accepted, never answered), the master's connect began 2 s into the
    try, and its timer, run by the loop held at it, was judged by the try's bound, which had run on
    time: "Timeout connecting to server" (a 503) while the master answered in a millisecond."""
    with sentinel_group(tmp_path) as group, socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        sentinels = f"127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{group.sentinel_port}"

        async def ping_with_the_loop_held() -> bool:
            client = command_client(Settings(redis_url=f"redis+sentinel://{sentinels}/{MASTER_NAME}/0"))
            try:
                ping = asyncio.create_task(client.ping())
                connections = client.connection_pool._get_in_use_connections
                while not ping.done() and all(c.port != group.master_port for c in connections()):
                    await asyncio.sleep(0)  # the sentinels asked (the silent one 2 s), the master's connect made
                time.sleep(HELD_S)  # the loop held: the master's answer and the connect's timer both due
                return await ping
            finally:
                await client.aclose()

        assert asyncio.run(ping_with_the_loop_held()) is True
