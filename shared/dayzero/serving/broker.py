"""Celery's broker transport: kombu's Redis transport, through a Redis that becomes a replica (a
failover's old master) or refuses writes for a while, consuming on.

A Redis that becomes a replica (``REPLICAOF``) answers every blocked client ``-UNBLOCKED force
unblock from blocking operation, instance state changed`` and closes its connection, while it goes
on answering reads. redis-py raises that as a plain ``ResponseError``, which kombu counts among its
channel errors, not its connection errors: the consumer's blocked ``BRPOP`` ended Celery's worker
with "Unrecoverable error" (every idle worker at each switch). Parsed as a ``ConnectionError``
(``UnblockedIsLostParser``; the gateway's blocked XREAD reads with the asyncio one), Celery logs
"Connection to broker lost" and reconnects, as after a Redis restart.

A consumer (re)starting declares its queue (kombu: its length in a transaction, its binding's SADDs),
which a replica (``READONLY``) or a Redis at its memory limit (``OOM``) refuses: Celery took that
for an unrecoverable error too, and the process exited (at a worker's start, its weights loaded for
nothing). The declaration now waits for Redis to take writes: one log line when it waits, one when
it goes on. A refusal no wait ends (WRONGTYPE, an ACL's NOPERM) fails it as before. The consumer's
queue read refused so (its BRPOP pops: too few replicas refuse it) is a lost connection too, and so
is a refused health check: a Redis whose save failed (MISCONF) refuses PING, which redis-py sends on
a connection idle past its ``health_check_interval`` (kombu's: 25 s). (A new channel's PING, which
it refuses too, fails Celery's connect, which it tries again, as with Redis down.)

A lost connection closes the consumer's channel: its delivered, unacknowledged messages (the
requests the worker runs on meanwhile) stay with their tasks, never put back on the queue (``QoS``).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import quote

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from redis.asyncio.connection import DefaultParser as AsyncDefaultParser
from redis.connection import DefaultParser

from ..redis_clients import RefusalSaidSentinelConnection
from ..redis_urls import sentinel_address
from .outage_log import OutageLog

log = logging.getLogger("dayzero.worker")
T = TypeVar("T")
UNBLOCKED = "UNBLOCKED"  # the error code Redis ends a blocked command with when it stops being a master
_AS_LOST = {UNBLOCKED: redis.ConnectionError}
REFUSED_POLL_S = 0.5  # how often a consumer about to consume asks again whether Redis takes writes
# refusals that last a while, of codes redis-py raises as a plain ResponseError: a failed save
# (stop-writes-on-bgsave-error), too few replicas (min-replicas-to-write)
_REFUSED_FOR_A_WHILE = {"MISCONF", "NOREPLICAS"}


class UnblockedIsLostParser(DefaultParser):
    EXCEPTION_CLASSES = {**DefaultParser.EXCEPTION_CLASSES, **_AS_LOST}


class AsyncUnblockedIsLostParser(AsyncDefaultParser):
    EXCEPTION_CLASSES = {**AsyncDefaultParser.EXCEPTION_CLASSES, **_AS_LOST}


class _UnblockedIsLost:
    """A connection whose parser raises ``UNBLOCKED`` as a lost connection."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("parser_class", UnblockedIsLostParser)
        super().__init__(*args, **kwargs)


class UnblockedIsLostConnection(_UnblockedIsLost, redis.Connection):
    pass


class UnblockedIsLostSSLConnection(_UnblockedIsLost, redis.SSLConnection):  # rediss://
    pass


class UnblockedIsLostSentinelConnection(_UnblockedIsLost, RefusalSaidSentinelConnection):  # redis+sentinel://
    pass


class QoS(virtual.QoS):
    """The delivered, unacknowledged messages of a channel (no ack emulation: ``make_celery``). kombu
    put them back on their queue when the channel closed: a lost connection (``CLIENT KILL``, a network
    blip, a Redis restart), after which Celery reconnects in ~0.1 s and its tasks go on running them.
    Each came back to a worker as a second delivery of a request under way, and the worker running it
    claimed it again (its own lease): a prompt prefilled twice (3 of 4 long prompts killed mid-prefill),
    and a "lease lapsed" warning for the run that lost. They now stay with the tasks running them:
    one line says how many. A process that dies with them leaves its requests' leases to lapse
    (the reaper re-runs them) and a message it never claimed to its queued mark (the reaper's orphan
    sweep), as a killed worker's; nothing is written to Redis, nor dumped into a file (kombu did, with
    the prompts, when Redis refused the restore)."""

    restore_at_shutdown = False  # (kombu's switch for the restore at a channel's close)

    def restore_unacked_once(self, stderr: object = None) -> None:
        self._flush()  # (the acks that came since)
        if self._delivered:
            log.info(
                "broker connection closed: %d delivered message(s) stay with the tasks running them",
                len(self._delivered),
            )
            self._delivered.clear()
        super().restore_unacked_once(stderr)


class Channel(kombu_redis.Channel):
    connection_class = UnblockedIsLostConnection
    connection_class_ssl = UnblockedIsLostSSLConnection

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if not self.ack_emulation:
            self.QoS = QoS
        self._refresh_refused = OutageLog(
            log,
            "Redis refuses kombu's refresh of its expiring bindings (%s); tried again each second",
            "%d more refreshes of kombu's expiring bindings refused",
            "kombu's expiring bindings refreshed again after %.1f s (%d more refused)",
        )

    def maybe_refresh_binding_expiry(self) -> None:
        """kombu's refresh of its expiring queues' bindings (Celery's remote control queue's), a script
        tried each second until it goes through: refused (a Redis at its memory limit refuses scripts
        while the queue read goes on), kombu logged a warning with its traceback at each try, a second
        apart (20 warnings, 920 lines in a worker's log in a 20 s refusal). Now its ``OutageLog``'s lines."""
        try:
            super().maybe_refresh_binding_expiry()
        except redis.ResponseError as exc:
            self._refresh_refused.failed(exc)
            return
        self._refresh_refused.back()

    def _brpop_read(self, **options: object) -> bool:
        """The consumer's queue read (BRPOP: a pop, a write) refused for a while (too few replicas, a
        failed save; a Redis at its memory limit lets it through) is a lost connection: Celery
        reconnects, and its declaration waits for writes (``_until_taken``). kombu took it for a
        channel error, and Celery ended the worker ("Unrecoverable error"): every worker at once."""
        try:
            return super()._brpop_read(**options)
        except redis.ResponseError as exc:
            if not writes_refused(exc):
                raise
            raise _lost("the queue read", exc, self.client.connection) from exc

    def _brpop_start(self, timeout: float | None = None) -> None:
        """The queue read's send: on a connection idle past redis-py's ``health_check_interval``
        (kombu's: 25 s; a worker whose every thread ran a task that long sent no read meanwhile), a
        PING first, which a Redis whose save failed refuses (MISCONF, as it refuses writes): a lost
        connection too (was: "Unrecoverable error"). No BRPOP was sent: the channel's close reads
        none (kombu's waited for its reply for ever)."""
        try:
            super()._brpop_start(timeout)
        except redis.ResponseError as exc:
            self._in_poll = None
            if not writes_refused(exc):
                raise
            raise _lost("the queue read's health check", exc, self.client.connection) from exc

    def _receive_one(self, c: redis.client.PubSub):
        """A read of the subscriptions' connection (Celery's remote control), whose health check (a
        PING every ``health_check_interval``, its answer read here) a Redis whose save failed refuses:
        a lost connection (was: every worker's "Unrecoverable error" within 25 s of the failed save)."""
        try:
            return super()._receive_one(c)
        except redis.ResponseError as exc:
            if not writes_refused(exc):
                raise
            self._in_listen = None
            raise _lost("the subscriptions' health check", exc, c.connection) from exc

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: object):
        return self._until_taken(queue, lambda: super(Channel, self).queue_declare(queue, passive, **kwargs))

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self._until_taken(queue, lambda: super(Channel, self)._queue_bind(exchange, routing_key, pattern, queue))

    @staticmethod
    def _until_taken(queue: str | None, declare: Callable[[], T]) -> T:
        """``declare()``, asked again every REFUSED_POLL_S while Redis answers and refuses it for a
        while (its queue's length in a transaction: OOM; its binding's SADDs: OOM, READONLY); a Redis
        it cannot reach fails it (Celery retries its connection itself), and so does a refusal for good."""
        waited = None
        while True:
            try:
                done = declare()
            except redis.ResponseError as exc:
                if not writes_refused(exc):  # (for good: WRONGTYPE, an ACL's NOPERM; Celery ends the worker)
                    raise
                if waited is None:
                    waited = time.monotonic()
                    log.warning(
                        "%s waits to consume: Redis refuses writes (%s); asking again every %.1f s",
                        queue,
                        exc,
                        REFUSED_POLL_S,
                    )
                time.sleep(REFUSED_POLL_S)
                continue
            if waited is not None:
                log.warning("%s consumes: Redis takes writes again after %.1f s", queue, time.monotonic() - waited)
            return done


def _lost(what: str, exc: redis.ResponseError, connection: redis.Connection) -> redis.ConnectionError:
    """Redis's refusal for a while (``writes_refused``) of ``what`` on ``connection`` as a lost
    connection, which Celery reconnects from (the connection closed)."""
    connection.disconnect()
    return redis.ConnectionError(f"Redis refused {what}: {exc}")


def writes_refused(exc: redis.ResponseError) -> bool:
    """Whether Redis refused a write for a while (its memory limit, a replica, ...), not for good
    (a key of another type, an ACL user's missing permission: waited for, the worker waited for ever,
    its one line saying Redis refuses writes)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError):
        return True
    # (a pipeline's: "Command # 1 (...) of pipeline caused error: MISCONF ...")
    code = str(exc).rpartition("caused error: ")[2].partition(" ")[0]
    return code in _REFUSED_FOR_A_WHILE or isinstance(exc, redis.exceptions.MasterDownError)


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The channel above, to the master its sentinels name (kombu's, which asks them at each connect)."""

    connection_class = UnblockedIsLostSentinelConnection


class Transport(kombu_redis.Transport):
    """The transport of a ``redis://`` or ``rediss://`` broker URL (``celery_broker``)."""

    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    """The transport of a ``redis+sentinel://`` URL: kombu's ``sentinel://`` one, with the channel above."""

    Channel = SentinelChannel


def celery_broker(url: str, transport_options: dict) -> dict:
    """Celery's settings for a broker at ``url`` (``redis://``, ``rediss://``: TLS, or
    ``redis+sentinel://``; settings.py refuses the rest): this module's transport. kombu's own, which
    a ``rediss://`` URL kept, went without the fixes above. Given a transport, kombu would connect to
    a ``rediss://`` URL without TLS unless told (``broker_use_ssl``): the server's certificate
    checked, as redis-py checks it for the same URL (the gateway's and the stages' own clients),
    unless the URL's ``ssl_cert_reqs`` says otherwise. A sentinel URL becomes kombu's form (one
    ``sentinel://`` URL a sentinel, the first with the master's password and db) and its master's
    name a transport option, beside ``transport_options`` (``broker_transport_options``).

    A worker takes a message only while one of its pool's threads is free (``worker_disable_prefetch``:
    its reserved tasks counted, not the channel's deliveries). The count a channel keeps starts from
    none on a new connection while the tasks of the lost one run on (``QoS``), and Celery 5.7 lowers
    no prefetch after a reconnect on Redis (its reduction is skipped with per-consumer QoS; 5.6 lowers
    it to the threads left free, one at least): a worker whose every thread ran a long prompt took as
    many messages again (5.6: one), each waiting unstarted for one of those to end while an idle peer
    could have run it (bench/prefetch_after_reconnect.py). Its reserved tasks outlive the connection:
    Celery keeps the running ones when it closes (``Consumer.on_close``)."""
    worker = {"broker_url": url, "broker_transport": TRANSPORT, "worker_disable_prefetch": True}
    worker["broker_transport_options"] = transport_options
    where = sentinel_address(url)
    if where is not None:
        user = "" if where.password is None else f"{_quoted(where.username or '')}:{_quoted(where.password)}@"
        sentinels = [f"sentinel://{_netloc(host, port)}" for host, port in where.sentinels]
        sentinels[0] = f"sentinel://{user}{_netloc(*where.sentinels[0])}/{where.db}"
        options = {"master_name": where.master_name, "sentinel_kwargs": where.sentinel_kwargs()}
        worker["broker_transport_options"] = {**transport_options, **options}
        return {**worker, "broker_url": ";".join(sentinels), "broker_transport": SENTINEL}
    if url.startswith("rediss://"):
        return {**worker, "broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_REQUIRED}}
    return worker


def _quoted(text: str) -> str:
    return quote(text, safe="")  # ("/" too: quote's default keeps it, and kombu read it as the host's end)


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # (an IPv6 address in brackets)


TRANSPORT = f"{__name__}:Transport"
SENTINEL = f"{__name__}:SentinelTransport"
