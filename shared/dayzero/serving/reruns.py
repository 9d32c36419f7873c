"""The re-runs' side of a request's life (dayzero.serving.lifecycle): a lapsed lease, an orphaned
message or a stopping worker's hand-back -> queued again. Their scripts are in
dayzero.serving.queue_scripts."""

from __future__ import annotations

import redis
from redis.commands.core import Script

from .keys import HANDOFF_OWNER, QUEUES, key


class Reruns:
    """``Lifecycle``'s re-run transitions, over its client and its registered RERUN and RERUN_HELD
    scripts."""

    r: redis.Redis
    _rerun: Script
    _rerun_held: Script

    def active(self) -> list[str]:
        return [m.decode() for m in self.r.smembers(key("active"))]

    def waiting(self, rids: list[str]) -> dict[str, tuple[str, int, str]]:
        """Of ``rids``, those whose message waits in a stage's queue for a worker to take it: id ->
        (the stage, the run's attempt, who ``settle`` names for it: "" queued, the handoff's owner
        handed off). A mark that names no queue (a re-run on its way) is left out. One round trip."""
        families = ("queued", "handoff", "lease", "attempt")
        marks = self.r.mget([key(family, rid) for rid in rids for family in families]) if rids else []
        found = {}
        for i, rid in enumerate(rids):
            queued, handoff, lease, attempt = (m.decode() if m else "" for m in marks[4 * i : 4 * i + 4])
            if lease == HANDOFF_OWNER and ":" in handoff:
                found[rid] = (handoff.partition(":")[0], int(attempt or 0), HANDOFF_OWNER)
            elif not lease and ":" in queued:
                found[rid] = (queued.partition(":")[0], int(attempt or 0), "")
        return found

    def rerun_orphan(self, rid: str, queued_s: float, sighting_s: float) -> int:
        """Queue the request again if it is unfinished, nobody holds its lease, and no message of it
        waits in a queue: its new attempt number (older deliveries become stale; the caller
        ``enqueue``s it, its queued mark holding ``queued_s`` till then); else 0. A message a worker
        took and never claimed (it died in between) is re-run when a second call finds it so, within
        ``sighting_s`` of the first: a live worker's claim may be just behind its pop. A request that
        ended or whose record expired leaves the active set here; a re-run drops the state the run
        over parked in Redis. One atomic step."""
        keys = [key(family, rid) for family in ("done", "req", "queued", "lease", "attempt")] + [key("active")]
        keys += [key("handoff", rid), key("orphan", rid), key("kvstate", rid)]
        keys += [k for queue in QUEUES for k in (queue, key("pushed", queue))]
        args = [int(queued_s * 1000), rid, HANDOFF_OWNER, int(sighting_s * 1000)]
        return int(self._rerun(keys=keys, args=args))

    def rerun_held(self, rid: str, attempt: int, owner: str, queued_s: float, spared: bool = False) -> int:
        """``owner`` (a stopping worker) gives up its run ``attempt``: the request is re-run as
        ``rerun_orphan`` re-runs one whose lease lapsed, at once (its new attempt: the caller sends it);
        0, nothing written: the run is over or someone else's, or the request ended. ``spared``: the run
        did not fail (its worker's loop ended), counted in ``spared``. One atomic step."""
        keys = [key(family, rid) for family in ("done", "req", "queued", "lease", "attempt", "handoff", "orphan")]
        args = [int(queued_s * 1000), attempt, owner, int(spared)]
        return int(self._rerun_held(keys=[*keys, key("kvstate", rid), key("spared", rid)], args=args))

    def spared(self, rid: str) -> int:
        """How many of the request's runs were given up by stopping workers whose loops had ended: no failure."""
        return int(self.r.get(key("spared", rid)) or 0)
