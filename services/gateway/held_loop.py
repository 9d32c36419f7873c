"""The retry of the gateway's Redis clients for a connect its own event loop timed out.

A connect's bound (``CONNECT_S``) is a timer on the event loop, and a loop held past it (a burst of
requests parsed on a starved host) found the connect answered and the timer due at once, and ran the
timer first: redis-py's "Timeout connecting to server" from a Redis that had answered in a
millisecond (test_held_loop_connect.py). Such a connect is made once more: one whose try's own
callback, due at the bound, ran ``LATE_S`` late (the loop was held at the bound, however long the try
took; a sentinel connection's bound begins again with its connect to the master, the sentinels asked:
``CONNECT_BEGINS``); not a connect timed out on time (an unreachable Redis: one bound), nor a command
that timed out (a frozen Redis: the commands' bound)."""

from __future__ import annotations

import asyncio

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from dayzero.redis_clients import CONNECT_BEGINS

CONNECT_S = 2.0  # a connect Redis has not answered this long fails (an unreachable host)
LATE_S = 0.05  # a callback due at the bound that ran this late: the loop was held (a free one: ~6 ms at load 7)
CONNECT_TIMED_OUT = "Timeout connecting to server"  # redis-py's error for a connect past its bound


class AtTheBound:
    """When the event loop ran a callback due ``CONNECT_S`` after a try began: the connect's timer
    (set as the try connects) falls due with it, so the callback's lateness is the timer's. A sentinel
    connection's try asks the sentinels first (2 s each, one unreachable): ``begin`` again as its
    connect to the master begins."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.handle: asyncio.TimerHandle | None = None
        self.due = 0.0
        self.ran: float | None = None
        self.begin()

    def begin(self) -> None:
        """Due ``CONNECT_S`` from now: the try began, or its connect did (a sentinel's master's)."""
        self.cancel()
        self.due, self.ran = self.loop.time() + CONNECT_S, None
        self.handle = self.loop.call_at(self.due, self.run)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()  # (ran already, or never needed)

    def run(self) -> None:
        self.ran = self.loop.time()

    def held(self) -> bool:
        """Whether a connect timing out now is the one this bound watched, and the loop was held at
        it: the callback ran late, less than ``CONNECT_S`` ago (a connect made after it, as by the
        client's own retry, times out ``CONNECT_S`` after it at the soonest)."""
        if self.ran is None:
            return False  # the try ended before its bound
        return self.ran - self.due > LATE_S and self.loop.time() - self.ran < CONNECT_S


class HeldLoopRetry(AsyncRetry):
    """Once more: a connect the loop timed out while held at its bound; with ``closed``, also a
    command on a connection Redis closed (it restarted). The stream hub's reader goes without
    ``closed``: it reads a closed connection as news of Redis (a restart ends the streams it lost:
    streams.py)."""

    def __init__(self, closed: bool) -> None:
        super().__init__(NoBackoff(), 1, (redis.ConnectionError, redis.TimeoutError))
        self.closed = closed

    async def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        loop = asyncio.get_running_loop()
        bound: AtTheBound | None = None

        async def one_try():
            nonlocal bound
            bound = AtTheBound(loop)
            watched = CONNECT_BEGINS.set((*CONNECT_BEGINS.get(), bound.begin))  # (a command's, its connect's)
            try:
                return await do()
            finally:
                CONNECT_BEGINS.reset(watched)
                bound.cancel()

        def again(error: Exception) -> bool:
            if is_retryable is not None and not is_retryable(error):
                return False
            held = str(error) == CONNECT_TIMED_OUT and bound is not None and bound.held()
            return (self.closed and isinstance(error, redis.ConnectionError)) or held

        return await super().call_with_retry(one_try, fail, again, with_failure_count)
