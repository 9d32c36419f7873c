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
from services.gateway import held_loop
from services.gateway.bus import command_client
from services.gateway.held_loop import CONNECT_S
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


def test_a_connect_made_again_that_times_out_on_time_is_not_made_a_third_time(monkeypatch):
    """A command's try reconnects inside the connect's own tries (redis-py nests them), and the
    command's retry judged the connect its inner retry had made again by the first's hold: an
    unreachable Redis (its connect never answered), met by a held loop, cost a third connect."""
    connects = 0

    async def unanswered(**address) -> None:
        nonlocal connects
        connects += 1
        if connects > 2:  # (a connect judged by the first's bound again, made for ever: a failure, not a hang)
            raise OSError("a third connect")
        if connects == 1:
            asyncio.get_running_loop().call_soon(time.sleep, HELD_S)  # the loop held past the connect's bound
        await asyncio.sleep(10 * CONNECT_S)  # Redis unreachable: the connect's timer ends it (late, the first)

    async def command() -> None:
        client = command_client(Settings(redis_url="redis://127.0.0.1:1/0"))  # (its connects: ``unanswered``)
        try:
            await client.ping()
        finally:
            await client.aclose()

    monkeypatch.setattr(asyncio, "open_connection", unanswered)
    with pytest.raises(redis.TimeoutError):
        asyncio.run(command())
    assert connects == 2


def test_a_command_over_an_open_connection_sets_no_connect_bound(redis_url, monkeypatch):
    """The bound that watches for a held loop is the connect's alone. Each command set two (each a
    timer set and cancelled, in the retry's every try): its own try's, and the pool's ``connect`` of
    its connection, open already."""
    bounds = 0

    class Counted(held_loop.AtTheBound):
        def __init__(self, *args) -> None:
            nonlocal bounds
            bounds += 1
            super().__init__(*args)

    async def commands() -> tuple[int, int]:
        client = command_client(Settings(redis_url=redis_url))
        try:
            await client.ping()  # the connection made: its connect's bound
            opened = bounds
            for _ in range(100):
                await client.get("held-loop-absent")
            return opened, bounds
        finally:
            await client.aclose()

    monkeypatch.setattr(held_loop, "AtTheBound", Counted)
    assert asyncio.run(commands()) == (1, 1)


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
