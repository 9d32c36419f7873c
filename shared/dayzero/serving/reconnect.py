"""A worker's consumer trying its broker connection again every second at most, for as long as Redis
is out: one serves again within ~1 s of Redis's return.

Celery's consumer tries again at kombu's default intervals, 2, 4, 6, ... up to 30 s apart (it passes
none of its own, and no setting of Celery's changes them): a worker took work again up to 12 s
after Redis was back from a 30 s outage, up to 30 s after a longer one, while the gateway queued
or refused its requests (bench/serve_after_outage.py). ``Consumer`` passes kombu's transport
options for them (``interval_start``, ``interval_step``, ``interval_max``, which kombu itself reads
only for a channel's connection): ``RETRY_INTERVALS`` (``queue.make_celery``). A try against a Redis
that is down costs a refused connect; Celery's line about each is bounded (``BrokerOutageFilter``).

A Redis that hangs rather than refuses (frozen; its host unreachable, its packets dropped) is bounded
too (``HANG_BOUNDS``, kombu's transport options for redis-py). kombu set no timeout on a connect or a
command, and looked for a queue read unanswered only every 25 s (its ``health_check_interval``; the read
dropped once 26 s overdue): a BRPOP whose reply was dropped waited for Redis's TCP retransmission (at
~25 and ~51 s of backoff) or that check, and a connect for the kernel's SYN retries (1, 3, 7, 15, 31 s
apart). After 30 s of dropped packets the workers took work again ~16 s after Redis was reachable
(bench/hung_redis.py). Now a read 1 + 5 s overdue (checked every 5 s) drops its connection, a connect
gives up after 2 s and is tried again a second later (``RETRY_INTERVALS``), a command after 5 s.

A Redis that refuses the worker's credentials (its password changed under a running worker, or it
restarted with another), or refuses its user a command (an ACL without PING: NOPERM), is no outage:
no try mends it. The consumer tried for ever, a line each 10 s, its worker alive and taking no work
(its requests waited for the no-worker bound, or for ever while its liveness stamps' older connection
went on). After ``credentials_refused_s`` of refusals it now says so
and exits 3, as a worker whose start Redis refuses does (runtime.py): its supervisor (``dayzero up``,
compose's restart policy) starts it again, with the settings it has then.
"""

from __future__ import annotations

from collections.abc import Callable

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection

from ..redis_refusals import RefusedCredentials

# the consumer's next try: 0.5 s after a lost connection, then every 1 s (kombu's default: 2, 4, ... 30 s)
RETRY_INTERVALS = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 1.0}
# a connect, a command, a queue read (BRPOP: 1 s in Redis) that Redis leaves unanswered this long fails
HANG_BOUNDS = {"socket_connect_timeout": 2.0, "socket_timeout": 5.0, "health_check_interval": 5}
CONSUMER = f"{__name__}:Consumer"  # Celery's ``worker_consumer``
CREDENTIALS_REFUSED_S = "dayzero_credentials_refused_s"  # the Celery app's setting: Settings.credentials_refused_s


class Consumer(CeleryConsumer):
    """Celery's worker consumer, whose tries to connect again are spaced as its connection's transport
    options say (``RETRY_INTERVALS``), not by kombu's defaults, and whose process exits once Redis has
    refused its credentials for ``CREDENTIALS_REFUSED_S`` (its app's setting)."""

    def ensure_connected(self, conn: Connection) -> Connection:
        intervals = {name: conn.transport_options[name] for name in RETRY_INTERVALS if name in conn.transport_options}
        refused = RefusedCredentials(self.app.conf[CREDENTIALS_REFUSED_S])
        ensure = conn.ensure_connection

        def ensure_connection(errback: Callable | None = None, *args: object, **kwargs: object) -> Connection:
            def failed(exc: Exception, interval: float) -> None:
                refused.tried(exc)
                if errback is not None:
                    errback(exc, interval)

            return ensure(failed, *args, **{**intervals, **kwargs})  # (Celery's call passes no intervals)

        conn.ensure_connection = ensure_connection
        return super().ensure_connected(conn)
