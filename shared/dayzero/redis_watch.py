"""``dayzero up``'s watch on a Redis it was given, once the stack is ready: one line when the Redis
is lost, one when it is back (a Redis of its own is a child: its exit is said as a restart). It
said nothing: the stack's requests failed, /ready answered 503, and up's terminal looked well."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .redis_clients import sync_client, unreached
from .redis_urls import without_password

CHECK_EVERY_S = 1.0  # a ping at most this often; each waits as long at most (a frozen Redis)


class RedisWatch:
    """``check()`` from up's supervising loop: pings the Redis at ``url`` (every ``CHECK_EVERY_S``
    at most) and ``say``s a line when the first ping fails and one when a ping goes through again.
    Each ping runs on a thread of its own and ``check()`` never waits for it: inline, a frozen Redis
    or sentinel held up's loop (its restarts of exited workers) for each ping's timeout, 2 s a pass
    behind a sentinel. Each thread is a daemon: the executor's thread was joined at up's exit, which
    waited out the ping in flight (6 s behind three frozen sentinels) where Ctrl-C cut it inline."""

    def __init__(self, url: str, say: Callable[[str], None]) -> None:
        self.url, self.say = url, say
        timeouts = {"socket_connect_timeout": CHECK_EVERY_S, "socket_timeout": CHECK_EVERY_S}
        self.client = sync_client(url, retry=Retry(NoBackoff(), 0), **timeouts)
        self._ping: Future | None = None  # the ping in flight, or answered and not yet read
        self._checked = float("-inf")  # when that ping was sent (monotonic)
        self._lost_at: float | None = None  # when the first ping of this outage was sent (monotonic)

    def check(self) -> None:
        if self._ping is not None:
            if not self._ping.done():
                return
            self._read(self._ping)
            self._ping = None
        now = time.monotonic()
        if now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            self._ping = Future()
            threading.Thread(target=self._send, args=(self._ping,), name="redis-watch", daemon=True).start()

    def close(self) -> None:
        """Its connections closed (a sentinel URL's to the sentinels too), at up's end: they were left
        open. A ping still in flight fails, unread."""
        self.client.close()
        sentinels = getattr(
            self.client.connection_pool, "sentinel_manager", None
        )  # (redis-py's SentinelConnectionPool)
        if sentinels is not None:
            sentinels.close()

    def _send(self, ping: Future) -> None:
        try:
            ping.set_result(self.client.ping())
        except BaseException as exc:  # (raised in up's loop by check(), as the inline ping's was)
            ping.set_exception(exc)

    def _read(self, ping: Future) -> None:
        try:
            ping.result()
        except redis.RedisError as exc:
            if self._lost_at is None:
                self._lost_at = self._checked
                why = unreached(self.url, exc)
                self.say(f"redis {without_password(self.url)} lost: {why}; /ready answers 503 until it is back")
            return
        if self._lost_at is not None:
            self.say(f"redis {without_password(self.url)} back after {time.monotonic() - self._lost_at:.0f} s")
            self._lost_at = None
