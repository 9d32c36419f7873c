"""Who reads a stream, against a real Redis: the gateway's set of readers per request, and the
cancel once nobody reads it."""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio as aioredis

from dayzero.serving.admission import record_s
from dayzero.serving.keys import key
from dayzero.serving.watching import Watching, cancel_left


def test_watch_counts_readers_as_long_as_the_request_can_live(redis_url):
    async def run() -> tuple[int, int, int]:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=60, queued_s=60)
        await watching.watch("w1", "a")
        await watching.watch("w1", "b")
        count, ttl = await client.scard(key("watchers", "w1")), await client.ttl(key("watchers", "w1"))
        left = await watching.unwatch("w1", "a")
        await client.aclose()
        return count, ttl, left

    count, ttl, left = asyncio.run(run())
    assert count == 2 and 60 < ttl <= record_s(60, 60) and left == 1


def test_a_reader_past_the_stream_ttl_still_counts(redis_url):
    """A client reads a request for longer than the stream TTL, a second one joins, the first
    leaves: one reader is left (a count that lapsed with the TTL had the second reader's request
    cancelled under it, and the last leave left a count of -1 without a TTL). The last reader to
    leave takes the key with it."""

    async def run() -> tuple[int, int, int, bool]:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=1, queued_s=1)  # its record: 4 s
        await watching.watch("w2", "first")
        await asyncio.sleep(1.5)  # past the stream TTL
        await watching.watch("w2", "second")
        first_left = await watching.unwatch("w2", "first")
        reading_ttl = await client.ttl(key("watchers", "w2"))
        second_left = await watching.unwatch("w2", "second")
        gone = not await client.exists(key("watchers", "w2"))
        await client.aclose()
        return first_left, second_left, reading_ttl, gone

    first_left, second_left, reading_ttl, gone = asyncio.run(run())
    assert (first_left, second_left) == (1, 0)
    assert reading_ttl > 1 and gone  # read: the request's life; unread: nothing left behind


def test_a_retried_watch_or_unwatch_counts_once(redis_url):
    """The gateway's Redis client retries a command once when the connection drops, so a reader's
    watch or unwatch can run twice (its first reply lost). Counted by reader, a doubled watch kept
    a left request "read" for good (never cancelled), a doubled unwatch cancelled the request
    under another reader. With nobody left, cancel_unwatched asks the worker to stop."""

    async def run() -> tuple[int, int, int, bool, bool]:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=60, queued_s=60)
        await watching.watch("w3", "a")
        doubled = await watching._change("w3", "a", coming=True)  # the retried watch
        await watching.watch("w3", "b")
        await watching.unwatch("w3", "b")
        after_doubled_leave = await watching._change("w3", "b", coming=False)  # the retried unwatch
        await watching.cancel_unwatched("w3")
        cancelled_while_read = bool(await client.exists(key("cancel", "w3")))
        last = await watching.unwatch("w3", "a")
        await watching.cancel_unwatched("w3")
        cancelled = bool(await client.exists(key("cancel", "w3")))
        await client.aclose()
        return doubled, after_doubled_leave, last, cancelled_while_read, cancelled

    doubled, after_doubled_leave, last, cancelled_while_read, cancelled = asyncio.run(run())
    assert (doubled, after_doubled_leave, last) == (1, 1, 0)
    assert not cancelled_while_read and cancelled


class WriteGate:
    """A TCP hop to Redis that holds a client's first write (SET, or a script) until ``release``:
    what that client sent before it has reached Redis, what it sends after waits with it."""

    WRITES = (b"\r\nSET\r\n", b"\r\nEVALSHA\r\n", b"\r\nEVAL\r\n")

    def __init__(self, redis_port: int) -> None:
        self.redis_port, self.holding, self.released = redis_port, asyncio.Event(), asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        redis_in, redis_out = await asyncio.open_connection("127.0.0.1", self.redis_port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, gated: bool) -> None:
            while data := await source.read(65536):
                if gated and not self.released.is_set() and any(w in data.upper() for w in self.WRITES):
                    self.holding.set()
                    await self.released.wait()
                sink.write(data)
                await sink.drain()
            sink.close()

        await asyncio.gather(pipe(client_in, redis_out, True), pipe(redis_in, client_out, False))

    def release(self) -> None:
        self.released.set()
        self.server.close()


def test_a_reader_that_comes_while_the_cancel_is_decided_keeps_its_request(redis_url):
    """A resume's watch that reaches Redis after the cancel's reads and before its write (on another
    gateway, or the two meeting after a Redis stall) is judged by Redis: the request is not
    cancelled under its reader (as two reads then a write, it was)."""

    async def run() -> tuple[bool, int]:
        gate = WriteGate(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
        gated = aioredis.Redis(port=await gate.start())
        direct = aioredis.Redis.from_url(redis_url)
        cancelling = asyncio.create_task(Watching(gated, stream_ttl_s=60, queued_s=60).cancel_unwatched("w4"))
        await asyncio.wait_for(gate.holding.wait(), 10)  # the cancel's write waits in the gate
        await Watching(direct, stream_ttl_s=60, queued_s=60).watch("w4", "resumed")
        gate.release()
        await asyncio.wait_for(cancelling, 10)
        cancelled, readers = bool(await direct.exists(key("cancel", "w4"))), await direct.scard(key("watchers", "w4"))
        await gated.aclose()
        await direct.aclose()
        return cancelled, readers

    assert asyncio.run(run()) == (False, 1)


def test_a_cancel_left_while_another_gateway_reads_the_request_is_not_recorded(redis_url):
    """A stopping gateway's last read unwatched, then a resume on another gateway watched before the
    stopping one left the cancel to Redis: nothing is left (the resume's read decides), so that read's
    leave, within its own grace when the stopped gateway's ends, is not cancelled there. (Two commands:
    the entry written under the reader stayed, and cancelled the request in its grace.)"""

    async def run() -> None:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=60, queued_s=60)
        await watching.watch("w5", "stopping")
        assert await watching.unwatch("w5", "stopping") == 0  # the stopping gateway's last read
        await watching.watch("w5", "resumed")  # another gateway's, in between
        await watching.cancel_later("w5", time.time() - 1)  # its grace ends now
        await watching.unwatch("w5", "resumed")  # the resumed read left: its own grace runs
        await client.aclose()

    asyncio.run(run())
    client = redis.Redis.from_url(redis_url)
    assert cancel_left(client, 60) == [] and not client.exists(key("cancel", "w5"))
    client.close()


def test_a_cancel_left_again_while_a_pass_cancels_the_due_one_stays_till_it_is_due(redis_url):
    """A reaper pass reads the due cancels; before it removes them, another stopping gateway leaves the
    request's cancel again, due later (a resumed read of it ended there): that entry stays, due at its
    own time. (Read, then removed apart: the new entry went unseen, and its cancel was lost.)"""
    client = redis.Redis.from_url(redis_url)
    client.zadd(key("left"), {"w6": time.time() - 1})
    read_due = client.zrangebyscore

    def left_again_after_the_read(*args, **kwargs):
        due = read_due(*args, **kwargs)
        client.zadd(key("left"), {"w6": time.time() + 60})  # (the other gateway's cancel_later)
        return due

    client.zrangebyscore = left_again_after_the_read
    assert cancel_left(client, 60) == [] and not client.exists(key("cancel", "w6"))
    assert client.zscore(key("left"), "w6") > time.time() + 50
    client.close()
