"""What fails ``dayzero up``'s start before its children run (``StartFailed``), and its check that an
external Redis answers."""

from __future__ import annotations

import time

import redis

from .redis_clients import sync_client, unreached
from .redis_refusals import refused_for_good
from .redis_urls import without_password


class StartFailed(RuntimeError):
    """A service cannot start (a bad checkpoint, a missing dependency, a port in use, ...)."""


def answering(url: str, within_s: float) -> None:
    """StartFailed unless the Redis at ``url`` answers a ping within ``within_s``: one that was
    unreachable (a closed port, a wrong host) kept ``up`` waiting for ever, "waiting: redis
    unreachable" every 10 s, without --ready-timeout. One that refuses it for good (``refused_for_good``:
    a wrong password, a user not allowed PING, which waited the 10 s) fails at once."""
    client = sync_client(url, socket_connect_timeout=2, socket_timeout=2)
    redis_at = f"the Redis at {without_password(url)} (DAYZERO_REDIS_URL or REDIS_URL)"
    deadline = time.monotonic() + within_s
    try:
        while True:
            try:
                client.ping()
                return
            except redis.RedisError as exc:
                if refused := refused_for_good(url, exc):  # a wrong password, a refused PING: no wait mends it
                    raise StartFailed(f"{redis_at}: {refused}") from None
                if time.monotonic() >= deadline:
                    raise StartFailed(
                        f"{redis_at} did not answer within {within_s:g} s: {unreached(url, exc)}; start it, or unset "
                        "both to run an embedded one"
                    ) from None
                time.sleep(0.5)
    finally:
        client.close()
