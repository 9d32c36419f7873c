"""One reader's subscription to a request's token stream (``streams.StreamHub`` feeds it): the
entries read for it, queued up to ``BACKLOG``, and how its reader takes them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from dayzero.serving.records import Token

BACKLOG = 512  # entries queued for one subscriber (a stalled client's), at most, plus one read's


def entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def valid_entry_id(entry: str) -> bool:
    """A stream entry id Redis takes: ``ms-seq``, both parts unsigned 64-bit."""
    parts = re.fullmatch(r"([0-9]{1,20})-([0-9]{1,20})", entry)
    return parts is not None and max(int(parts[1]), int(parts[2])) < 2**64


class Closed(Exception):
    """The gateway is shutting down: the subscription ends (the stream says so)."""


@dataclass(eq=False)
class Subscription:
    request_id: str
    last: str  # entries after this id are delivered
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # Token | BaseException
    ahead: Token | BaseException | None = None  # taken from the queue by ``pending``, not yet read
    resume: Callable[[], None] = lambda: None  # the hub reads a held subscription's stream again
    held: bool = False  # BACKLOG entries behind: the hub reads its stream no further for now
    looked: str | None = None  # ``last`` when the hub last looked for ended requests (unchanged since: quiet)
    taken_in: bool = False  # a blocked read of the hub's reads its stream (its wake-up refused: not yet)

    async def next(self, timeout_s: float) -> Token | None:
        """The next entry; None after ``timeout_s`` without one; raises what ended the stream."""
        item, self.ahead = self.ahead, None
        if item is None:
            try:  # not asyncio.wait_for: in 3.11 it loses a cancel that comes as the entry does, and a
                # cancelled stream (its client gone) would read on, its request never cancelled
                async with asyncio.timeout(timeout_s):
                    item = await self.queue.get()
            except TimeoutError:
                return None
        self._taken()
        if isinstance(item, BaseException):
            raise item
        return item

    def pending(self) -> list[Token]:
        """The tokens already queued behind the one just read, up to the stream's last (which, like
        an error, is left for ``next``): a lagging reader sends them as one chunk."""
        tokens = []
        while self.ahead is None and not self.queue.empty():
            item = self.queue.get_nowait()
            if isinstance(item, BaseException) or item.finish_reason:
                self.ahead = item
            else:
                tokens.append(item)
        self._taken()
        return tokens

    def _taken(self) -> None:
        if self.held and self.queue.qsize() <= BACKLOG // 2:
            self.held = False
            self.resume()

    def close(self, reason: BaseException) -> None:
        self.queue.put_nowait(reason)
