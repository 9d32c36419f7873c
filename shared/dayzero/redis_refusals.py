"""What a Redis (or its sentinels) answers that no wait mends, said in one line: a wrong password,
none given where one is asked, a command the URL's user may not run. A service that meets one at
its start ends (``refusal_at_start``); one that meets it for DAYZERO_CREDENTIALS_REFUSED_S while
serving exits to be started again with its current settings, but for a gateway refused one command
(gateway/refused_commands.py: it serves on, and says so)."""

from __future__ import annotations

import logging
import os
import re
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .redis_clients import SentinelRefused, password_of, sync_client
from .redis_urls import sentinel_address, without_password

log = logging.getLogger("dayzero.redis")
REFUSED_EXIT = 3  # a service that cannot serve with its settings (a worker's failed start too)

# what Redis answers credentials no wait mends: a wrong password (or none where one is asked; a
# sentinel's too: SentinelRefused), a command the URL's user may not run (an ACL without PING...)
REFUSED_FOR_GOOD = (redis.AuthenticationError, redis.exceptions.NoPermissionError)
# a command refused where redis-py raises another error: a Lua script's call (Redis 6's words), a transaction's
REFUSED_INSIDE = ("can't run this command or subcommand", "NOPERM")
# a transaction's EXEC after its MULTI was refused (redis-py sends every transaction's MULTI itself and
# raises EXEC's answer, not MULTI's NOPERM; the commands between ran one by one, outside a transaction)
MULTI_REFUSED = "EXEC without MULTI"


def _multi_refused(exc: BaseException) -> bool:
    return isinstance(exc, redis.ResponseError) and str(exc) == MULTI_REFUSED


def command_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing the URL's user a command (NOPERM), in a script or a transaction too
    (the reaper's passes failed on those without a line, and /ready called that Redis unreachable), its
    MULTI alone too (``MULTI_REFUSED``: the same, and a request no worker took waited for ever)."""
    if isinstance(exc, redis.exceptions.NoPermissionError) or _multi_refused(exc):
        return True
    return isinstance(exc, redis.ResponseError) and any(said in str(exc) for said in REFUSED_INSIDE)


def refused_command(exc: BaseException) -> str:
    """The command ``exc`` (``command_refused``) names: 'multi' for a refused MULTI's EXEC, the one
    Redis 7's NOPERM names ('client|kill' for a subcommand), else 'unnamed' (Redis 6's words in a
    script name none)."""
    if _multi_refused(exc):
        return "multi"
    named = re.search(r"'([\w|-]+)' command", str(exc))
    return named.group(1).lower() if named else "unnamed"


def refused_words(exc: BaseException) -> str:
    """A refused command's words in ``exc``: a refused MULTI's too (its EXEC's answer names no refusal)."""
    if _multi_refused(exc):
        return f"'multi', which opens every transaction: Redis answered its EXEC \"{exc}\""
    return str(exc)


def _where_to_look(exc: BaseException, acl: str) -> str:
    """Where to look for why ``exc``'s command is refused: ``acl`` (the ACL's words), and for a refused
    MULTI the server's config too: rename-command disabling it answers EXEC the same, and the ACL alone
    was named, which then allowed everything."""
    if _multi_refused(exc):
        return f"{acl}; or the server's config renamed or disabled MULTI: rename-command"
    return acl


def told(exc: BaseException) -> BaseException | str:
    """``exc`` as a line of an outage says it: a command refused the user as that, with where to look (a
    worker's loop said a refused MULTI as "redis unavailable (EXEC without MULTI)"); else as it is."""
    if not command_refused(exc):
        return exc
    look = _where_to_look(exc, "ACL GETUSER lists what it may run")
    return f"Redis refuses the user a command ({refused_words(exc)}; {look})"


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
    if command_refused(exc):
        where = sentinel_address(url)
        user = (where.username if where else redis.connection.parse_url(url).get("username")) or "default"
        look = _where_to_look(exc, f"ACL GETUSER {user} lists what it may run")
        return f"its user {user!r} is refused a command dayzero sends ({refused_words(exc)}; {look})"
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


class RefusedCredentials:
    """A service's failed tries at Redis, one after another: once Redis has refused its credentials (a
    wrong or changed password: ``AuthenticationError``; a command its user may not run: ``NoPermissionError``)
    for ``bound_s``, the process says so and exits ``REFUSED_EXIT`` for its supervisor to start it again
    (any other failure between, or a try that went through: ``taken``, begins the count again).
    ``process``: what the line calls it (a worker's broker connection, the gateway's reaper passes)."""

    def __init__(self, bound_s: float, process: str = "worker") -> None:
        self.bound_s, self.process = bound_s, process
        self._since: float | None = None

    def taken(self) -> None:
        self._since = None

    def tried(self, exc: Exception) -> None:
        if not isinstance(exc, REFUSED_FOR_GOOD):
            self._since = None
            return
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if now - self._since >= self.bound_s:
            log.error(
                "Redis has refused this %s's credentials for %.0f s (%s): exiting %d for its supervisor to "
                "start it again with its current settings (DAYZERO_REDIS_URL)",
                self.process,
                now - self._since,
                exc,
                REFUSED_EXIT,
            )
            from .telemetry import flush_spans

            flush_spans()  # (os._exit runs no exit handlers: the last batch of spans was dropped)
            logging.shutdown()
            os._exit(REFUSED_EXIT)
