"""One clock for the stamps that worker processes write and other processes read: Redis's (TIME).

A stamp of the writer's own time.time() read against the reader's was off by the hosts' skew: a
worker on a host behind by the reader's window was never live, one ahead stayed live that long
after it stopped. A stamp is written by a script that reads TIME (``NOW``) and read with TIME in
the read's own round trip (``hashes_at``): the hosts' clocks need not agree.
"""

from __future__ import annotations

import redis

# Lua: ``now``, Redis's time as "seconds.micros", to begin a script that stamps with it. (TIME
# before a write: Redis >= 5 replicates a script's effects, not the script.)
NOW = """
local time = redis.call('TIME')
local now = string.format('%d.%06d', time[1], time[2])
"""


def hashes_at(client: redis.Redis, *names: str) -> tuple[float, list[dict[bytes, bytes]]]:
    """Redis's time now and the hashes ``names``, in one round trip."""
    pipe = client.pipeline()
    pipe.time()
    for name in names:
        pipe.hgetall(name)
    (seconds, micros), *hashes = pipe.execute()
    return seconds + micros / 1e6, hashes
