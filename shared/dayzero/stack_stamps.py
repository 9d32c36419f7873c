"""``dayzero up``'s read of its workers' liveness stamps (dayzero.serving.liveness), once per
``supervise()`` pass: every stage's stamps and Redis's time in one round trip (``seen_stages``),
which both say which starting workers are ready and which running ones are frozen. (The two
read them apart, the frozen check once per stage: four round trips and a write a pass.)
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import NamedTuple

import redis

from .service_commands import SERVICES
from .serving.keys import key
from .serving.liveness import STAMP_EVERY_S, Seen, process_id, seen_stages
from .stack_child import Child

WRITE_CHECK_TTL_S = 10  # up's own write beside its read of the stamps (key up:{process}) lapses after


class StampRead(NamedTuple):
    """One read of the stamps: ``stages`` ({} when Redis could not be read), ``began`` and ``at`` (when
    it was sent and answered, time.monotonic()), ``late``: unreadable, answered (its write too) after
    ``STAMP_EVERY_S`` (a frozen Redis continued) or its write refused (maxmemory, a replica, paused): no worker could
    stamp meanwhile, for the stamps are writes too."""

    stages: dict[str, Seen]
    began: float
    at: float
    late: bool

    def stamped(self, child: Child, family: str = "alive") -> float | None:
        """When ``child``'s process last stamped (``family`` "ready": since when it is ready), on this
        host's monotonic clock (how old by Redis's clock: as old on this one); None if it has not."""
        found = self.stages.get(child.service)
        at = None if found is None else getattr(found, family).get(process_id(child.proc.pid, socket.gethostname()))
        return None if at is None else self.at - found.now + at


def read_stamps(client: redis.Redis, write_check: bool) -> StampRead:
    """Every stage's stamps in one round trip, then (``write_check``: for the frozen check) a write of
    up's own, which a Redis refusing the workers' stamps refuses too."""
    began, stages, refused = time.monotonic(), {}, False
    with contextlib.suppress(redis.RedisError):
        stages = seen_stages(client, SERVICES[1:])
    at = time.monotonic()  # (the stamps' ages date from here: the write's round trip left out)
    try:
        if write_check and stages:
            client.set(key("up", process_id()), time.time(), ex=WRITE_CHECK_TTL_S)
    except redis.RedisError:
        refused = True
    return StampRead(stages, began, at, not stages or refused or time.monotonic() - began > STAMP_EVERY_S)
