"""The gateway's stream subscriptions: a cancelled reader stops reading, whatever arrives meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from dayzero.serving.records import Token
from services.gateway.streams import Subscription


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
