"""Every Redis client dayzero builds, from its one URL (``DAYZERO_REDIS_URL``): ``redis://``,
``rediss://`` (TLS), or a master that Redis Sentinel watches::

    redis+sentinel://[[user]:password@]host[:26379][,host2[:port]...]/master_name[/db][?sentinel_password=...[&sentinel_username=...]]

The user and password are the master's (and its replicas'); ``sentinel_password`` (and
``sentinel_username``, an ACL user's) the sentinels' own (``requirepass`` in sentinel.conf), none
when left out. The query's values are percent-decoded only: a ``+`` is itself (a password's), not a
space. TLS (``rediss+sentinel://``) is refused: redis-py and kombu carry it (``ssl`` in the
sentinels' kwargs, the master's ``SentinelManagedSSLConnection``), broker.py's sentinel connection
(a blocked read ended on a demoted master) has no TLS twin yet. A sentinel client asks the sentinels
for the master's address at each new connection, and drops its connection when the server it holds
stops being the master (READONLY, or the UNBLOCKED that ends a blocked read): the caller's retry of
a lost connection (each client's ``Retry``, Celery's reconnect, the gateway's stream reader) then
reaches the new master. kombu's own form (``sentinel://h:p;sentinel://h2:p`` and a master name in
``broker_transport_options``) carries no master name, so it is refused, with this one's spelling.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url as parse_async_url
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelManagedConnection

from .redis_urls import sentinel_address


def password_of(url: str) -> str | None:
    """The password ``url``'s clients log in to the master with (None: none)."""
    where = sentinel_address(url)
    return redis.connection.parse_url(url).get("password") if where is None else where.password


class SentinelRefused(redis.AuthenticationError):
    """No sentinel named the master, and every one the URL names refuses its ``sentinel_password``
    (a wrong one, none given to one that asks, a sentinel restarted with another ``requirepass``):
    credentials refused, which no wait mends and each caller says as it says a master's refusal (``up``
    at once; a worker exits past DAYZERO_CREDENTIALS_REFUSED_S; ``/ready``'s reason). redis-py's
    MasterNotFoundError, a lost connection, was an outage: retried for ever, "unreachable"."""


def _refused_by_sentinels(sentinels: list[dict[str, Any]]) -> str | None:
    """Which sentinel refuses its client's credentials, in one line, when every one does; None when one
    takes them or does not answer (it may take them: a worker cut from all but a misconfigured one exited,
    past DAYZERO_CREDENTIALS_REFUSED_S, in an outage). ``sentinels``: each one's connection keywords
    (redis-py's sentinel clients'), each asked once (a connection of its own: no retry, no pool)."""
    refused = None
    for kwargs in sentinels:
        asked = {name: kwargs.get(name) for name in ("host", "port", "username", "password")}
        timeouts = {name: kwargs.get(name) for name in ("socket_timeout", "socket_connect_timeout")}
        connection = redis.Connection(**asked, **timeouts, retry=Retry(NoBackoff(), 0))
        try:
            connection.connect()  # (AUTH, when a password is given)
            connection.send_command("PING")
            connection.read_response()
            return None  # (one takes it: the master is what it could not name)
        except redis.AuthenticationError as refusal:
            what = "sentinel_password" if asked["password"] is not None else "a client without sentinel_password"
            refused = refused or f"sentinel {asked['host']}:{asked['port']} refuses {what} ({refusal})"
        except redis.RedisError:
            return None  # (unreachable: an outage, waited for)
        finally:
            connection.disconnect()
    return refused


def _sentinels_of(connection: SentinelManagedConnection | AsyncSentinelConnection) -> list[dict[str, Any]]:
    return [
        sentinel.connection_pool.connection_kwargs for sentinel in connection.connection_pool.sentinel_manager.sentinels
    ]


def _refusal_among(exc: redis.ConnectionError) -> bool:
    """Whether a sentinel's refusal is among the errors redis-py's MasterNotFoundError lists (each
    sentinel's, by its class's name): only then are the sentinels asked again (an outage, sentinels
    that hang among them, costs no second round of their timeouts)."""
    return redis.AuthenticationError.__name__ in str(exc)


class RefusalSaidSentinelConnection(SentinelManagedConnection):
    """A connection to the master its sentinels name, which fails with ``SentinelRefused`` where they
    named none because every one refuses the URL's sentinel credentials."""

    def connect(self) -> None:
        try:
            super().connect()
        except MasterNotFoundError as exc:
            if _refusal_among(exc) and (refused := _refused_by_sentinels(_sentinels_of(self))):
                raise SentinelRefused(refused) from exc
            raise


class _RefusalSaidAsyncSentinelConnection(AsyncSentinelConnection):
    """``RefusalSaidSentinelConnection``'s asyncio twin (the sentinels asked on a thread: a failed connect's cost)."""

    async def connect(self) -> None:
        try:
            await super().connect()
        except AsyncMasterNotFoundError as exc:
            if _refusal_among(exc) and (refused := await asyncio.to_thread(_refused_by_sentinels, _sentinels_of(self))):
                raise SentinelRefused(refused) from exc
            raise


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client of the Redis (the current master) at ``url``; ``kwargs``: its connections'."""
    where = sentinel_address(url)
    if where is None:
        return redis.Redis.from_url(url, **kwargs)
    sentinel = Sentinel(list(where.sentinels), sentinel_kwargs=where.sentinel_kwargs())
    connections = {"connection_class": RefusalSaidSentinelConnection, **where.connection_kwargs()}
    return sentinel.master_for(where.master_name, redis.Redis, **connections, **kwargs)


class _BlockingSentinelPool(AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """A sentinel's master pool that waits for a free connection (``max_connections``), never fails."""


def async_client(
    url: str, *, blocking: bool = False, connection_mixin: type | None = None, **kwargs: Any
) -> aioredis.Redis:
    """An asyncio client of the Redis (the current master) at ``url``; ``blocking``: its pool waits
    for a free connection past ``max_connections`` (``timeout`` s at most) instead of failing;
    ``connection_mixin``: first among its connections' bases, whichever class ``url`` asks for (the
    gateway's held-loop connect: services/gateway/held_loop.py)."""
    where = sentinel_address(url)
    if where is None:
        chosen = parse_async_url(url).get("connection_class", aioredis.Connection)  # (TLS: rediss://)
        kwargs = {"connection_class": _mixed(connection_mixin, chosen), **kwargs}
        if blocking:
            return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(url, **kwargs))
        return aioredis.Redis.from_url(url, **kwargs)
    sentinel = AsyncSentinel(list(where.sentinels), sentinel_kwargs=where.sentinel_kwargs())
    pool_class = _BlockingSentinelPool if blocking else AsyncSentinelPool
    connection_class = _mixed(connection_mixin, _RefusalSaidAsyncSentinelConnection)
    connections = {"connection_class": connection_class, **where.connection_kwargs()}
    return sentinel.master_for(
        where.master_name, aioredis.Redis, connection_pool_class=pool_class, **connections, **kwargs
    )


@functools.cache
def _mixed(mixin: type | None, connection_class: type) -> type:
    """``connection_class`` with ``mixin`` first among its bases (its methods first, their ``super()``
    ``connection_class``'s); itself without one."""
    if mixin is None:
        return connection_class
    return type(f"{mixin.__name__}{connection_class.__name__}", (mixin, connection_class), {})


def unreached(url: str, exc: redis.RedisError) -> str:
    """Why the Redis at ``url`` was not reached, in one line: for sentinels that named no master,
    which (redis-py's own text repeats each sentinel client's repr, some 1,500 characters; its
    asyncio client's error is a class of its own)."""
    if not isinstance(exc, (MasterNotFoundError, AsyncMasterNotFoundError)) or (where := sentinel_address(url)) is None:
        return str(exc)
    text, sentinels = str(exc), ", ".join(f"{host}:{port}" for host, port in where.sentinels)
    why = text.rpartition(": ")[2] if " : " in text else "those that answer name none up"  # (the last one's error)
    return f"no sentinel ({sentinels}) named the master {where.master_name!r}: {why}"
