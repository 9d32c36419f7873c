"""The gateway's stream subscriptions: a cancelled reader stops reading, whatever arrives meanwhile;
one bad read ends only its own subscription."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

import pytest
import redis
import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.queue import make_celery
from dayzero.serving.records import Token, encode
from dayzero.settings import Settings
from services.gateway.bus import Bus
from services.gateway.streams import StreamHub
from services.gateway.subscription import BACKLOG, Subscription, valid_entry_id


def test_a_reader_cancelled_as_an_entry_arrives_is_cancelled():
    """A client that leaves cancels its stream's task; were that cancel lost to an entry arriving in
    the same turn of the loop (asyncio.wait_for in Python 3.11), the stream would read on, and its
    request would run to the end with nobody reading."""

    async def scenario() -> None:
        sub = Subscription("r", "0-0")
        reader = asyncio.create_task(sub.next(10.0))
        await asyncio.sleep(0)  # the reader waits for an entry
        sub.queue.put_nowait(Token("r", 0, 5, "x"))
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader

    asyncio.run(scenario())


def test_a_reader_gets_the_next_entry_or_none_after_its_timeout():
    async def scenario() -> tuple[Token | None, Token | None]:
        sub = Subscription("r", "0-0")
        idle = await sub.next(0.01)
        sub.queue.put_nowait(Token("r", 0, 5, "x"))
        return idle, await sub.next(0.01)

    idle, entry = asyncio.run(scenario())
    assert idle is None and entry == Token("r", 0, 5, "x")


def test_tokens_queued_behind_a_read_are_pending_and_the_last_is_left_for_next():
    """A gateway that lags sends what has queued up as one chunk: ``pending`` takes the tokens,
    never the stream's last entry (its chunk carries the finish) nor an error."""

    async def scenario() -> tuple:
        sub = Subscription("r", "0-0")
        for i, text in enumerate("abc"):
            sub.queue.put_nowait(Token("r", i, 5, text))
        sub.queue.put_nowait(Token("r", 3, 6, "d", finish_reason="length"))
        first = await sub.next(0.01)
        queued = sub.pending()
        after = sub.pending()  # the last entry waits for next; pending takes nothing more
        last = await sub.next(0.01)
        failing = Subscription("r", "0-0")
        failing.queue.put_nowait(Token("r", 0, 5, "x"))
        failing.queue.put_nowait(ConnectionError("redis lost"))
        await failing.next(0.01)
        return first, queued, after, last, failing.pending(), failing

    first, queued, after, last, before_error, failing = asyncio.run(scenario())
    assert first.text == "a" and [t.text for t in queued] == ["b", "c"] and after == []
    assert last.text == "d" and last.finish_reason == "length"
    assert before_error == []
    with pytest.raises(ConnectionError):
        asyncio.run(failing.next(0.01))


def test_only_well_formed_64_bit_entry_ids_are_valid():
    assert valid_entry_id("0-0") and valid_entry_id("12-3")
    assert valid_entry_id(f"{2**64 - 1}-{2**64 - 1}")
    for bad in (f"{2**64}-0", "1-99999999999999999999", "12", "12-", "-3", "a-b", "²-0", " 1-0"):
        assert not valid_entry_id(bad), bad


def test_a_subscription_whose_read_redis_refuses_ends_alone(redis_url):
    """One reader serves every open stream: a read Redis refuses (an id past 64 bits, had one got
    through) ends the subscription that asked for it, and the others read on."""
    stream = key("tokens", "good")

    async def scenario() -> tuple:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=200)
        await commands.xadd(stream, encode(Token("good", 0, 5, "a")), id="1-0")
        async with hub.subscribe("good") as good:
            first = await good.next(5)
            async with hub.subscribe("bad", "1-99999999999999999999") as bad:
                with pytest.raises(redis.ResponseError):
                    await bad.next(5)
            await commands.xadd(stream, encode(Token("good", 1, 6, "b", finish_reason="length")), id="2-0")
            second = await good.next(5)
        await hub.close()
        await commands.aclose()
        return first, second

    first, second = asyncio.run(scenario())
    assert (first.text, second.text, second.finish_reason) == ("a", "b", "length")


class CuttingRelay:
    """A TCP relay to a Redis that cuts every connection, and takes no new one, right after passing on
    a reply that holds ``marker`` (Redis lost at that moment, as a real link to it is)."""

    def __init__(self, redis_port: int, marker: bytes) -> None:
        self.redis_port, self.marker, self.links = redis_port, marker, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # cut
                return
            server = socket.create_connection(("127.0.0.1", self.redis_port))
            self.links += [client, server]
            threading.Thread(target=self._pass, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pass, args=(server, client, True), daemon=True).start()

    def _pass(self, source: socket.socket, to: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                to.sendall(data)
                if replies and self.marker in data:
                    return self.cut()
        except OSError:
            return

    def cut(self) -> None:
        for s in (self.listener, *self.links):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_redis_lost_while_a_refused_read_is_sorted_out_ends_every_stream(redis_url):
    """Redis refuses the hub's read (one subscription's id) and is lost as the hub sorts out whose read
    it refused: every open stream ends with the loss. (It ended the hub's reader task, its exception
    never retrieved, and every open stream waited for ever, sending keep-alives.)"""

    async def scenario() -> tuple[BaseException, BaseException]:
        commands = aioredis.Redis.from_url(redis_url)
        relay = CuttingRelay(commands.connection_pool.connection_kwargs["port"], b"Invalid stream ID")
        hub = StreamHub(relay.url, commands, block_ms=200)  # its reads through the relay, wake-ups not
        ends = []
        async with hub.subscribe("other") as other, hub.subscribe("bad", "1-99999999999999999999") as bad:
            for sub in (bad, other):
                try:
                    ends.append(await sub.next(30))
                except redis.RedisError as exc:
                    ends.append(exc)
        await hub.close()
        await commands.aclose()
        return tuple(ends)

    bad, other = asyncio.run(scenario())
    assert isinstance(bad, redis.ConnectionError) and isinstance(other, redis.ConnectionError)


def test_a_stalled_reader_holds_a_bounded_backlog_and_then_reads_every_entry(redis_url):
    """A client that stops reading: its gateway queues at most ``BACKLOG`` (plus one read's) of its
    stream's entries, the rest waiting in Redis; another stream reads on meanwhile; once the client
    takes half, the hub reads its stream again at once (a wake-up, not after the long block), and
    every entry arrives once, in order. Closing the hub ends its blocked read at once."""
    total = 3 * BACKLOG

    async def scenario() -> tuple:
        commands = aioredis.Redis.from_url(redis_url)
        pipe = commands.pipeline(transaction=False)
        for i in range(total):
            pipe.xadd(key("tokens", "slow"), encode(Token("slow", i, 5, str(i))), id=f"{i + 1}-0")
        await pipe.execute()
        hub = StreamHub(redis_url, commands, block_ms=60_000)
        async with hub.subscribe("slow") as slow, hub.subscribe("other") as other:
            await asyncio.sleep(0.5)  # the hub reads what it may; the client reads nothing
            queued = slow.queue.qsize()
            await commands.xadd(key("tokens", "other"), encode(Token("other", 0, 5, "x")), id="1-0")
            other_first = await other.next(5)
            texts = []
            while len(texts) < total and (entry := await slow.next(5)) is not None:
                texts.append(entry.text)
        async with asyncio.timeout(30):  # its read blocks for 60 s: closing does not wait it out
            await hub.close()
        await commands.aclose()
        return queued, other_first, texts

    queued, other_first, texts = asyncio.run(scenario())
    assert BACKLOG <= queued <= BACKLOG + 64 and other_first.text == "x"
    assert texts == [str(i) for i in range(total)]


def test_a_wake_up_that_reaches_redis_before_the_read_is_not_missed(redis_url):
    """A new subscriber's wake-up can reach Redis between the hub computing its next read's streams
    (without the new one) and that read arriving: the read must return at once and take the new
    stream in, not block for the whole keepalive (``$`` would see only wake-ups after the read)."""
    stream = key("tokens", "late")

    async def scenario() -> Token:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=60_000)
        await commands.xadd(stream, encode(Token("late", 0, 5, "a")), id="1-0")
        sub = Subscription("late", "0-0")
        await hub._wake()  # the wake-up lands first ...
        async with asyncio.timeout(10):
            await hub._read_once()  # ... then the read computed before ``sub`` joined: it returns at once
            hub.subs.add(sub)
            await hub._read_once()  # the next read has the new stream's entry
        await hub.close()
        await commands.aclose()
        return await sub.next(0.01)

    assert asyncio.run(scenario()).text == "a"


def test_an_entry_the_hub_cannot_read_ends_its_stream_alone_and_a_failed_read_ends_every_stream(redis_url, monkeypatch):
    """The hub's reader is a task nobody awaits: an exception other than Redis's ended it, and every
    open stream waited for ever (keep-alives) until another subscribed. An entry it cannot read (not
    a token's: another writer's) ends its own stream; any other failure ends every open one."""
    good_stream, bad_stream = key("tokens", "fine"), key("tokens", "foreign")

    async def scenario() -> tuple:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=200)
        await commands.xadd(good_stream, encode(Token("fine", 0, 5, "a")), id="1-0")
        await commands.xadd(bad_stream, {"z": "not a token"}, id="1-0")
        async with hub.subscribe("fine") as good, hub.subscribe("foreign") as bad:
            with pytest.raises(KeyError):
                await bad.next(5)
            first = await good.next(5)
            failing = RuntimeError("a bug in the read")
            monkeypatch.setattr(StreamHub, "_read_once", lambda self: (_ for _ in ()).throw(failing))
            await commands.xadd(good_stream, encode(Token("fine", 1, 6, "b")), id="2-0")
            with pytest.raises(RuntimeError):
                while await good.next(5) is not None:
                    pass
        await hub.close()
        await commands.aclose()
        return first

    assert asyncio.run(scenario()).text == "a"


def test_a_stream_whose_wake_up_redis_refuses_is_read_before_the_hub_s_block_ends(redis_url):
    """A read that begins while Redis refuses writes (its wake-up refused) while the hub's read blocks
    (60 s here; a keep-alive in a gateway): its stream's entries, and one that comes once the refusal
    ends, reach it before that block ends (were: only after it)."""
    stream = key("tokens", "resumed")

    async def scenario() -> tuple[Token | None, Token | None]:
        commands = aioredis.Redis.from_url(redis_url)
        hub = StreamHub(redis_url, commands, block_ms=60_000)
        await commands.xadd(stream, encode(Token("resumed", 0, 5, "a")), id="1-0")
        async with hub.subscribe("another"):
            await asyncio.sleep(0.5)  # the hub's read blocks
            try:
                await commands.config_set("maxmemory", 1)  # Redis refuses writes (as writes_refused)
                async with hub.subscribe("resumed") as resumed:
                    there = await resumed.next(10)
                    await commands.config_set("maxmemory", 0)  # ... and takes them again
                    await commands.xadd(stream, encode(Token("resumed", 1, 5, "b")), id="2-0")
                    came = await resumed.next(10)
            finally:
                await commands.config_set("maxmemory", 0)
        async with asyncio.timeout(30):
            await hub.close()
        await commands.aclose()
        return there, came

    there, came = asyncio.run(scenario())
    assert there is not None and there.text == "a"
    assert came is not None and came.text == "b"


def test_the_gateways_stream_reads_are_bounded_past_their_block_by_its_commands_bound(redis_url):
    """A gateway's blocked read unanswered DAYZERO_GATEWAY_REDIS_TIMEOUT_S past its block (the keep-alive)
    ends its streams (was 10 s whatever the setting: tests of a hung Redis waited it out)."""
    settings = Settings(redis_url=redis_url, keepalive_s=1.5, gateway_redis_timeout_s=3.0)

    async def read_bound() -> float:
        bus = Bus(settings, make_celery(settings))
        try:
            return bus.hub.r.connection_pool.connection_kwargs["socket_timeout"]
        finally:
            await bus.close()

    assert asyncio.run(read_bound()) == 1.5 + 3.0
