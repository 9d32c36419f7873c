"""A Redis URL read without redis-py: the sentinel form's parts (``sentinel_address``), the forms
refused, and the URL as it may be printed (``without_password``). ``redis_clients`` builds the clients
from them; ``Settings`` refuses a bad DAYZERO_REDIS_URL with them at every command, most of which use no
Redis (redis-py, and the OpenTelemetry SDK it imports, cost ~0.2 s of CPU per start)."""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
FORM = f"{SENTINEL_SCHEME}://[[user]:password@]host[:port][,host2[:port]...]/master_name[/db][?sentinel_password=...]"
QUERY_KEYS = ("sentinel_password", "sentinel_username")
BROKER_QUERY_PREFIX = "ssl_"  # the query keys of a plain URL that kombu takes too (its ssl options)
_SENTINEL_ASKED_S = 2.0  # how long a question to one sentinel may take (the next is asked then)


@functools.cache
def query_keys_taken() -> frozenset[str]:
    """The query keys a URL's client takes: redis-py passes each to its connection (any other fails there).
    (redis is imported here, asked only of a URL whose query holds an @: ``Settings`` checks the URL at every
    command, most of which use no Redis.)"""
    import redis

    classes = (redis.connection.AbstractConnection, redis.SSLConnection)
    keywords = {name for c in classes for name in inspect.signature(c.__init__).parameters} - {"self", "kwargs"}
    return frozenset((*QUERY_KEYS, *redis.connection.URL_QUERY_ARGUMENT_PARSERS, *keywords))


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """A master that sentinels watch: where to ask, and what to connect with."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    sentinel_username: str | None = None

    def connection_kwargs(self) -> dict[str, Any]:
        """The master's connections' own keywords (redis-py's)."""
        return {"db": self.db, "username": self.username, "password": self.password}

    def sentinel_kwargs(self) -> dict[str, Any]:
        """The keywords of the connections to the sentinels themselves."""
        timeouts = {"socket_timeout": _SENTINEL_ASKED_S, "socket_connect_timeout": _SENTINEL_ASKED_S}
        return {**timeouts, "username": self.sentinel_username, "password": self.sentinel_password}


def sentinel_address(url: str) -> SentinelAddress | None:
    """The sentinels and master ``url`` names (None for a ``redis://`` or ``rediss://`` URL); a
    ValueError, naming the form, for any other URL or a sentinel URL without a master name."""
    scheme = url.partition("://")[0]
    if _userinfo_cut(urlsplit(url)):
        raise ValueError(
            "a Redis URL's password with a raw /, ? or # cuts the URL short (redis-py's message showed part of it): "
            "percent-encode them (%2F, %3F, %23)"
        )
    if "password" in _query(urlsplit(url).query):  # (redis-py reads it; kombu, Celery's broker, fails on it)
        raise ValueError(
            f"a Redis URL's password goes before its host ({scheme}://[user]:password@host...), not ?password="
        )
    if scheme in ("redis", "rediss"):
        refused = sorted(name for name in _query(urlsplit(url).query) if not name.startswith(BROKER_QUERY_PREFIX))
        if refused:  # (redis-py takes them; each Celery connection, a worker's start, raised a TypeError)
            raise ValueError(
                f"a Redis URL's query takes {BROKER_QUERY_PREFIX}* keys (TLS) alone, not {', '.join(refused)}: "
                "Celery's broker (kombu) fails on any other (a TypeError at each connection)"
            )
        return None
    if scheme != SENTINEL_SCHEME:
        hint = f" ({scheme}:// is kombu's form, which names no master)" if scheme == "sentinel" else ""
        raise ValueError(f"dayzero serves with a redis://, rediss:// (TLS) or {FORM} URL{hint}")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"a Redis Sentinel URL names its sentinels and its master: {FORM}")
    query = _query(parts.query)
    unknown = set(query) - set(QUERY_KEYS)
    if unknown:
        raise ValueError(
            f"a Redis Sentinel URL takes {' and '.join(QUERY_KEYS)} alone, not {', '.join(sorted(unknown))}"
        )
    return SentinelAddress(
        sentinels=tuple(_host_port(h) for h in hosts.split(",")),
        master_name=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        sentinel_password=query.get("sentinel_password"),
        sentinel_username=query.get("sentinel_username"),
    )


def _query(text: str) -> dict[str, str]:
    """A URL's query, each value percent-decoded alone (``parse_qs`` reads a ``+`` as a space: a
    sentinel password with one was refused); the last of a key's values."""
    pairs = (item.partition("=") for item in text.split("&") if item)
    return {unquote(name): unquote(value) for name, _, value in pairs}


def _userinfo_cut(parts: SplitResult) -> bool:
    """A raw /, ? or # in a URL's password ends its netloc there: the rest, "@" and the host, reads
    as the path, the query or the fragment (and what came before the cut as a host and a port). An @
    in the query is a cut's unless the value of a key the client takes holds it (``:a?b=c@h`` read as
    ``b``'s value; ``?client_name=app@web`` taken: a plain URL's was refused)."""
    if "@" in parts.netloc:
        return False
    query_ats = (item for item in parts.query.split("&") if "@" in item)
    return "@" in parts.path + parts.fragment or any(
        item.partition("=")[0] not in query_keys_taken() for item in query_ats
    )


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not colon:
        host, port = text, str(SENTINEL_PORT)
    if not host or not port.isdigit():
        raise ValueError(f"a sentinel is host[:port], not {text!r}: {FORM}")
    return host.strip("[]"), int(port)


def without_password(url: str) -> str:
    """``url`` as it may be printed or logged: its password (also ``password=``, redis-py's query form)
    and its sentinels' (``sentinel_password=``) as ``***`` (any text: no parse that could fail, in an
    error's message; a password with a raw / showed from the /)."""
    url = re.sub(r"([?&](?:sentinel_)?password=)[^&#]*", r"\1***", url)
    # to the last @ before the sentinel keys (a password may hold /, ?, @; "sentinel_username=ops@corp" starred
    # the host's port and the path)
    keys = re.search(r"[?&]sentinel_(?:username|password)=", url)
    end = keys.start() if keys else len(url)
    return re.sub(r"^(\w[\w+.-]*://[^:/@]*:).*@", r"\1***@", url[:end]) + url[end:]
