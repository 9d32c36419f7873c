"""The connect of the gateway's Redis connections, made once more when its own event loop timed it out.

A connect's bound (``CONNECT_S``) is a timer on the event loop, and a loop held past it (a burst of
requests parsed on a starved host) found the connect answered and the timer due at once, and ran the
timer first: redis-py's "Timeout connecting to server" from a Redis that had answered in a
millisecond (test_held_loop_connect.py). Such a connect is made once more: one whose own callback,
set as the connect begins and so due with its timer, ran ``LATE_S`` late (the loop was held at the
bound); not a connect timed out on time (an unreachable Redis: one bound), nor a command that timed
out (a frozen Redis: the commands' bound). The callback is the connection's (``HeldLoopConnect``,
whichever class the URL asks for: plain, TLS, a sentinel's master, whose connect begins once the
sentinels named it): a command over an open connection sets none."""

from __future__ import annotations

import asyncio

CONNECT_S = 2.0  # a connect Redis has not answered this long fails (an unreachable host)
LATE_S = 0.05  # a callback due at the bound that ran this late: the loop was held (a free one: ~6 ms at load 7)


class AtTheBound:
    """When the event loop ran a callback due ``bound_s`` after a connect began: the connect's timer,
    set as it begins, falls due with it, so the callback's lateness is the timer's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bound_s: float) -> None:
        self.loop, self.due = loop, loop.time() + bound_s
        self.ran: float | None = None
        self.handle = loop.call_at(self.due, self.run)

    def run(self) -> None:
        self.ran = self.loop.time()

    def held(self) -> bool:
        """Whether the loop was held at the bound: the callback ran ``LATE_S`` late (it runs before
        the connect's own timer, due a moment after it)."""
        return self.ran is not None and self.ran - self.due > LATE_S


class HeldLoopConnect:
    """First among a redis.asyncio connection class's bases (``dayzero.redis_clients.async_client``'s
    ``connection_mixin``): its connect (``socket_connect_timeout``, never None here), timed out by
    its loop held at the bound, is made once more; the connect made again is not judged (a loop
    held at its bound too: the error, as an unreachable Redis's)."""

    socket_connect_timeout: float

    async def _connect(self) -> None:
        bound = AtTheBound(asyncio.get_running_loop(), self.socket_connect_timeout)
        try:
            await super()._connect()  # (redis-py's, under its timer)
        except TimeoutError:
            if not bound.held():
                raise
            await super()._connect()
        finally:
            bound.handle.cancel()  # (ran already, or never needed)
