"""Room across a decode stage of several workers: a request that one worker's pools cannot hold yet
goes to a worker with room for it.

Celery hands a decode worker up to its prefetch count of messages (2 x DAYZERO_MAX_BATCH) whatever
its pools hold, and each waits claimed in that worker's intake: without this, a request waited for
one of its worker's own requests to end while another worker idled. Now a worker whose claimed
requests wait for blocks hands them back to decode's queue (``Lifecycle.hand_back``) when a live
peer's last snapshot (registry.py) shows nothing waiting and free blocks for them, and takes no
message until its own pools could hold what it handed back (its consumer's prefetch at the messages
it holds). Alone, or with every peer full, it keeps them claimed and waiting, as before: never
refused, never left to lapse on the queue.

The hand back is fenced like every transition: the handoff keeps its lease, its prefill blocks and
its deadline, only its message (and mark) is new; a worker killed at any point leaves the request
to the reaper (a lapsed lease, or a mark whose message was taken and never claimed). It never
bounces for ever: each hand back needs a peer with room for it and a few leases of the handoff left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..telemetry import continued
from .intake import Ticket
from .lease import Heartbeat
from .messages import DecodeJob
from .runtime import Runtime

log = logging.getLogger("dayzero.decode")
LEAST_LEASES = 4  # of the handoff left for its next claimer (else this worker keeps it)


class Prefetch:
    """A Celery worker's prefetch count: its own (take messages) or 1 (with a message held: take no
    more). Set from any thread; Celery's event loop applies it between polls (as its autoscaler's)."""

    def __init__(self) -> None:
        self._consumer: Any = None

    def bind(self, sender: Any = None, **_: object) -> None:
        """A ``worker_ready`` receiver: ``sender`` is the worker's consumer."""
        self._consumer = sender

    def pause(self, paused: bool) -> None:
        qos = getattr(self._consumer, "qos", None)
        if qos is None:  # not started yet
            return
        wanted = 1 if paused else self._consumer.initial_prefetch_count
        if qos.value > wanted:
            qos.decrement_eventually(qos.value - wanted)
        elif qos.value < wanted:
            qos.increment_eventually(wanted - qos.value)


class Room:
    """A decode loop's view of its peers' room: ``hand_back`` a few times per lease, ``consume``
    every iteration."""

    def __init__(self, runtime: Runtime, prefetch: Prefetch, message: Callable[[DecodeJob], str]) -> None:
        self.r, self.prefetch, self.message = runtime, prefetch, message  # message: a job -> decode's queue's
        self.owed: int | None = None  # tokens of the smallest request handed back since the pools last had room

    def consume(self, busy: bool) -> None:
        """Take messages unless something was handed back that the pools could not hold yet (with
        nothing running, they could)."""
        if self.owed is not None and (not busy or self.r.pools.fits(self.owed)):
            self.owed = None
        self.prefetch.pause(self.owed is not None)

    def hand_back(
        self, waiting: list[Ticket[DecodeJob]], tokens: Callable[[DecodeJob], int], heartbeat: Heartbeat
    ) -> list[Ticket[DecodeJob]]:
        """Hand the waiting requests that a peer has room for back to decode's queue; -> those still
        waiting. ``tokens``: what a job reserves; ``heartbeat``: the loop's, beating the claims."""
        room = self._peer_room() if waiting else []
        still = []
        for ticket in waiting:
            total = tokens(ticket.job)
            need = self.r.pools.layout.blocks_of(total)
            peer = next((free for free in room if all(free.get(k, 0) >= n for k, n in need.items())), None)
            if peer is None or not self._hand_back(ticket, heartbeat):
                still.append(ticket)
                continue
            for kind, n in need.items():
                peer[kind] -= n
            self.owed = total if self.owed is None else min(self.owed, total)
        return still

    def _peer_room(self) -> list[dict[str, int]]:
        """Free blocks per pool of each live peer with nothing waiting, from its last snapshot."""
        registry, settings = self.r.registry, self.r.settings
        peers = [p for p in registry.live_workers(self.r.stats.stage, settings.lease_s) if p != self.r.name]
        return [
            {kind: total - used for kind, (used, total) in snap.get("pools", {}).items()}
            for snap in registry.snapshots_of(peers).values()
            if not snap.get("gauges", {}).get("waiting_requests")
        ]

    def _hand_back(self, ticket: Ticket[DecodeJob], heartbeat: Heartbeat) -> bool:
        job, least_s = ticket.job, LEAST_LEASES * self.r.settings.lease_s
        rid = job.request.request_id
        heartbeat.release(rid)  # no beat in flight outlives the claim
        with continued(job.request.trace):  # its message's task span joins the request's trace
            message = self.message(job)
        if not self.r.store.hand_back(rid, job.attempt, self.r.name, "decode", message, least_s):
            heartbeat.hold([rid])  # still this worker's (or its run is over: the take will say so)
            return False
        log.info("request %s: handed back to the queue for a worker with room", rid)
        ticket.done.set()
        return True
