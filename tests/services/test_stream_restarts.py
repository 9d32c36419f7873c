"""The gateway's stream reader, its read ended by a Redis that answers again at once: a restarted
Redis (another ``run_id``) that came back empty holds none of the open streams, and nothing writes
them any more; they waited on keep-alives till their time limit. Now those end as a lost Redis's
do (a 503-style error event); a stream the restarted Redis still holds (its save) reads on. Two real
Redis servers behind a TCP forwarder the test points at the second one: a restart the reader's PING
cannot miss."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis
import redis.asyncio as aioredis

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key
from dayzero.serving.records import Token, encode
from services.gateway.outcome import stream_error
from services.gateway.streams import StreamHub

from .conftest import wait_until
from .test_replica_switch import blocked

STREAM = key("tokens", "r")
FIRST = encode(Token("r", 0, 5, "a"))


class Forwarder:
    """TCP to the Redis on ``port`` (switched by setting it); ``cut()`` closes what goes through."""

    def __init__(self, port: int) -> None:
        self.port, self.links, self.tasks = port, set(), set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.links |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def cut(self) -> None:
        for writer in self.links:
            writer.close()
        self.links.clear()

    async def close(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.parametrize("kept", [False, True], ids=["restarted-empty", "restarted-from-a-save"])
def test_streams_a_restarted_redis_no_longer_holds_end(tmp_path, kept):
    with scratch_redis() as first, scratch_redis() as restarted:

        async def scenario() -> tuple:
            forwarder = Forwarder(first)
            url = f"redis://127.0.0.1:{await forwarder.start()}/0"
            commands, again = aioredis.Redis.from_url(url), aioredis.Redis(port=restarted)
            hub = StreamHub(url, commands, block_ms=200)
            await commands.xadd(STREAM, FIRST, id="1-0")
            if kept:
                await again.xadd(STREAM, FIRST, id="1-0")
            async with hub.subscribe("r") as sub:
                read = [await sub.next(5)]
                on_first = redis.Redis(port=first)
                assert await asyncio.to_thread(wait_until, lambda: blocked(on_first, "xread") == 1, 10)
                forwarder.port = restarted  # (Redis restarted: its connections closed, another run)
                forwarder.cut()
                if kept:  # (restarted empty, no worker writes it: its append of index 1 is refused)
                    await again.xadd(STREAM, encode(Token("r", 1, 6, "b", finish_reason="length")), id="2-0")
                try:
                    read.append(await sub.next(5))  # (was, restarted empty: None, a keep-alive for ever)
                except redis.ConnectionError as exc:
                    read.append(exc)
            await hub.close()
            await forwarder.close()
            await commands.aclose()
            await again.aclose()
            return read

        first_read, second = asyncio.run(scenario())
    assert first_read.text == "a"
    if kept:
        assert (second.text, second.finish_reason) == ("b", "length")
    else:
        assert isinstance(second, redis.ConnectionError), second
        assert stream_error(second, "r")["error"]["code"] == "queue_unavailable"  # a 503-style end event
