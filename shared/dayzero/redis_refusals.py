"""What a Redis (or its sentinels) answers that no wait mends, said in one line: a wrong password,
none given where one is asked, a command the URL's user may not run. A service that meets one at
its start ends (``refusal_at_start``); one that meets it for DAYZERO_CREDENTIALS_REFUSED_S while
serving exits to be started again with its current settings."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .redis_clients import SentinelRefused, password_of, sentinel_address, sync_client, without_password

# what Redis answers credentials no wait mends: a wrong password (or none where one is asked; a
# sentinel's too: SentinelRefused), a command the URL's user may not run (an ACL without PING...)
REFUSED_FOR_GOOD = (redis.AuthenticationError, redis.exceptions.NoPermissionError)


def refused_for_good(url: str, exc: redis.RedisError) -> str | None:
    """Why the Redis at ``url`` refuses its clients (``exc``) where no wait mends it, in one line: a
    wrong password, none given where one is asked, a command the URL's user may not run (an ACL
    without it: NOPERM, which names the command), sentinels refusing ``sentinel_password``; else None
    (down, unreachable, loading: waited for)."""
    if isinstance(exc, SentinelRefused):  # (its own line names the sentinel)
        return str(exc)
    if isinstance(exc, redis.AuthenticationError):  # (a ConnectionError to redis-py)
        why = "password refused" if password_of(url) else "it asks for a password, and the URL gives none"
        return f"{why} ({exc})"
    if isinstance(exc, redis.exceptions.NoPermissionError):
        where = sentinel_address(url)
        user = (where.username if where else redis.connection.parse_url(url).get("username")) or "default"
        return f"its user {user!r} is refused a command dayzero sends ({exc}; ACL GETUSER {user} lists what it may run)"
    return None


def refusal_said(url: str, refused: str) -> str:
    """``refused_for_good``'s line ``refused`` for the Redis at ``url``, as a service says it at its end."""
    return f"the Redis at {without_password(url)} (DAYZERO_REDIS_URL): {refused}"


def refusal_at_start(url: str) -> str | None:
    """``refused_for_good``'s line where the Redis at ``url`` answers one ping with it; None where it
    takes the ping or does not answer (a service started before its Redis waits for it)."""
    client = sync_client(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    except redis.RedisError as exc:
        return refused_for_good(url, exc)
    finally:
        client.close()
    return None
