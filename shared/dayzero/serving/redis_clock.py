"""One clock for the stamps that worker processes write and other processes read: Redis's (TIME).

A stamp of the writer's own time.time() read against the reader's was off by the hosts' skew: a
worker on a host behind by the reader's window was never live, one ahead stayed live that long
after it stopped. A stamp is written by a script that reads TIME (``NOW``) and read with TIME in
the read's own round trip (``hashes_at``): the hosts' clocks need not agree.

A time kept in a record and read by other processes (a request's admission, ``created``, that
DAYZERO_TASK_TIME_LIMIT_S counts from) is on Redis's clock too, without a round trip per read:
``now()`` is this process's clock plus its offset to Redis's, measured on a call it makes anyway (a
worker's liveness stamp every second, the gateway's reaper reading them) with ``measured``, or ``sync``.
So are the due times of the cancels a stopped gateway leaves to the others (watching.py). A process
that has not measured yet (``known``) is on its host's clock: the gateway measures before it takes
requests (services/gateway/app.py).
"""

from __future__ import annotations

import time

import redis

# Lua: ``now``, Redis's time as "seconds.micros", to begin a script that stamps with it. (TIME
# before a write: Redis >= 5 replicates a script's effects, not the script.)
NOW = """
local time = redis.call('TIME')
local now = string.format('%d.%06d', time[1], time[2])
"""


_offset_s: float | None = None  # Redis's clock less this process's, as last measured (None: not yet)


def now() -> float:
    """Redis's time now (unix seconds) as this process knows it: no round trip (before ``known``,
    the host's time)."""
    return time.time() + (_offset_s or 0.0)


def known() -> bool:
    """This process has measured its offset to Redis's clock (``now`` is Redis's time)."""
    return _offset_s is not None


def measured(redis_now: float, sent: float, received: float) -> None:
    """Redis said ``redis_now`` to a call sent at ``sent`` and answered at ``received`` (this
    process's time.time()): its offset, taking Redis's reading at the round trip's middle."""
    global _offset_s
    _offset_s = redis_now - (sent + received) / 2


def sync(client: redis.Redis) -> None:
    """Measure this process's offset to Redis's clock (a TIME)."""
    sent = time.time()
    seconds, micros = client.time()
    measured(seconds + micros / 1e6, sent, time.time())


def hashes_at(client: redis.Redis, *names: str) -> tuple[float, list[dict[bytes, bytes]]]:
    """Redis's time now and the hashes ``names``, in one round trip (which measures this process's
    offset too: the gateway's reaper reads the stamps every pass)."""
    pipe = client.pipeline()
    pipe.time()
    for name in names:
        pipe.hgetall(name)
    sent = time.time()
    (seconds, micros), *hashes = pipe.execute()
    redis_now = seconds + micros / 1e6
    measured(redis_now, sent, time.time())
    return redis_now, hashes
