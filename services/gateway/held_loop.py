"""The retry of the gateway's Redis clients for a connect its own event loop timed out.

A connect's bound (``CONNECT_S``) is a timer on the event loop, and a loop held past it (a burst of
requests parsed on a starved host) found the connect answered and the timer due at once, and ran the
timer first: redis-py's "Timeout connecting to server" from a Redis that had answered in a
millisecond (test_held_loop_connect.py). Such a connect, its timer ``LATE_S`` late, is made once more;
not a connect timed out on time (an unreachable Redis: one bound), nor a command that timed out (a
frozen Redis: the commands' bound)."""

from __future__ import annotations

import time

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

CONNECT_S = 2.0  # a connect Redis has not answered this long fails (an unreachable host)
LATE_S = 0.5  # a connect's timer that ran this late: the event loop was held, not Redis slow
CONNECT_TIMED_OUT = "Timeout connecting to server"  # redis-py's error for a connect past its bound


class HeldLoopRetry(AsyncRetry):
    """Once more: a connect whose timer ran ``LATE_S`` late; with ``closed``, also a command on a
    connection Redis closed (it restarted). The stream hub's reader goes without ``closed``: it reads
    a closed connection as news of Redis (a restart ends the streams it lost: streams.py)."""

    def __init__(self, closed: bool) -> None:
        super().__init__(NoBackoff(), 1, (redis.ConnectionError, redis.TimeoutError))
        self.closed = closed

    async def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        began = time.monotonic()

        def again(error: Exception) -> bool:
            if is_retryable is not None and not is_retryable(error):
                return False
            late = str(error) == CONNECT_TIMED_OUT and time.monotonic() - began > CONNECT_S + LATE_S
            return (self.closed and isinstance(error, redis.ConnectionError)) or late

        return await super().call_with_retry(do, fail, again, with_failure_count)
