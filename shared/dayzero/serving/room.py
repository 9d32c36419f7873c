"""Room across a stage of several workers (decode, prefill): a request that one worker's pools cannot
hold yet goes to a worker with room for it.

Celery hands a worker up to its prefetch count of messages (decode: 2 x DAYZERO_MAX_BATCH, prefill:
DAYZERO_MAX_BATCH) whatever its pools hold, and each waits claimed in that worker's intake, first
come first served (waiting.py): without this, a request waited for one of its worker's own requests
to end while another worker idled, and on prefill every prompt claimed after one waiting for blocks
waited with it. Now a worker whose claimed requests wait for blocks hands them back to its stage's
queue when a live peer's last snapshot (registry.py) shows nothing waiting and free blocks for
them, and takes no message until its own pools could hold what it handed back (its consumer's
prefetch at the messages it holds). Its snapshot says so (``intake_paused``), and its peers hand
it nothing meanwhile, whatever blocks it shows free: it read none of them, and the peer that handed
them back took them back itself whenever it had room for its own smallest one, to hand them back
again (two busy decode workers: 233 of 251 hand-backs in a wave of bench/handback_decode.py were
such bounces, one request's 62). It walks them in admission order and keeps those its own free
blocks hold before the first that they do not (it admits them next); past that one, it keeps only
those no peer has room for. Alone, or with every peer full, it keeps them claimed and waiting, as
before: never refused, never left to lapse on the queue. A handed-back request keeps its place:
it goes to the queue's front, the next read's (at the back, it waited behind every request admitted
after it: 64 newer ones read first with 64 queued, bench/handback_order.py), and its admission time
(``created``) orders it wherever it lands.

Before its first push it ends its own queue read that waits blocked in Redis (a BRPOP its consumer
sent while it could take messages, which no pause recalls): Redis gives a pushed message to the
reader blocked longest, often that one, and the worker took back what it had just handed back (a
claim and a push per bounce; 7 of 16 hand-backs in bench/handback.py). It also holds each
handed-back message (its task, its prefetch slot) a quarter lease more, so that, paused, it sends
no new read while a peer's takes them.

Only what holds nothing here goes back: decode's waiting requests hold no blocks yet (their state
waits in prefill's); prefill hands back no prompt under way (mid-chunk, its blocks filled) nor one
whose request holds blocks here (a kept handoff), and a waiting prompt has read none of its image
embeddings (read once, when it starts). The hand back is fenced like every transition: decode's
handoff keeps its lease, its prefill blocks and its deadline (``Lifecycle.hand_back``); prefill's
prompt is queued again with its lease dropped, as vision hands it on (``Lifecycle.hand_on``); only
its message and mark are new. A worker killed at any point leaves the request to the reaper (a
lapsed lease, or a mark whose message was taken and never claimed). It never bounces for ever: each
hand back needs a peer with room for it (on decode also a few leases of the handoff left).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container
from typing import Any, Generic, TypeVar

import redis

from ..kv.layout import PoolLayout
from ..telemetry import continued
from .intake import Ticket
from .lease import Heartbeat
from .messages import DecodeJob, PrefillJob
from .outage_log import OutageLog
from .queue_reads import QueueReads
from .runtime import Runtime
from .waiting import Run, first_come

log = logging.getLogger("dayzero.serving")
LEAST_LEASES = 4  # of decode's handoff left for its next claimer (else this worker keeps it)
J = TypeVar("J", bound=Run)


class Prefetch:
    """A Celery worker's prefetch count: its own (take messages) or 1 (with a message held: take no
    more). Set from any thread; Celery's event loop applies it between polls (as its autoscaler's).
    ``reads``: the worker's queue reads (none named: a loop without Celery)."""

    def __init__(self, reads: QueueReads | None = None) -> None:
        self._consumer: Any = None
        self.reads = reads or QueueReads()

    def bind(self, sender: Any = None, **_: object) -> None:
        """A ``worker_ready`` receiver: ``sender`` is the worker's consumer."""
        self._consumer = sender

    def pause(self, paused: bool) -> bool:
        """-> whether this lowered the prefetch (its consumer sees it at its next poll), or may have:
        no consumer bound yet to ask."""
        qos = getattr(self._consumer, "qos", None)
        if qos is None:  # not started yet
            return True
        wanted = 1 if paused else self._consumer.initial_prefetch_count
        if qos.value > wanted:
            qos.decrement_eventually(qos.value - wanted)
            return True
        if qos.value < wanted:
            qos.increment_eventually(wanted - qos.value)
        return False

    def withhold(self, client: redis.Redis) -> None:
        """Take no message from now, before a hand back: pause, and end this worker's queue read that
        waits blocked in Redis (the pause never recalls one). Redis hands a pushed message to the
        reader blocked longest: often that one, so the worker took back what it had just handed back.
        Its consumer reads the nil as a timeout and, paused with a message held (the one it hands
        back), sends no other; a read it sent before it saw the pause is ended too (``end_now_or_next``:
        one that reached Redis after the first look stayed blocked its whole poll). Paused already (a
        hand back since the last resume), one look: the consumer saw that pause, or its own look goes
        on (looking on each time, a worker handing back through its waiting requests sent a CLIENT
        LIST every 10 ms: with 150 clients in Redis, ~1 ms of this process's CPU each, 0.1 ms of Redis's)."""
        if self.pause(True):
            self.reads.end_now_or_next(client)
        else:
            self.reads.end(client)


def to_decode(runtime: Runtime, message: Callable[[DecodeJob], str]) -> Callable[[DecodeJob, str], bool]:
    """Decode's hand back: the claimed handoff waits at decode's queue's front again, till its own
    deadline (kept here with fewer than LEAST_LEASES of it left). ``message``: a job -> decode's queue's."""
    least_s = LEAST_LEASES * runtime.settings.lease_s
    return lambda job, rid: runtime.store.hand_back(rid, job.attempt, runtime.name, "decode", message(job), least_s)


def to_prefill(runtime: Runtime, message: Callable[[PrefillJob], str]) -> Callable[[PrefillJob, str], bool]:
    """Prefill's hand back: the claimed prompt is queued at prefill's queue's front again, its lease
    dropped (vision's hand on, fenced alike). ``message``: a job -> prefill's queue's."""
    queued_s, store = runtime.settings.visibility_timeout_s, runtime.store
    return lambda job, rid: store.hand_on(rid, job.attempt, runtime.name, "prefill", message(job), queued_s, front=True)


class Room(Generic[J]):
    """A loop's view of its peers' room: ``hand_back`` a few times per lease, ``consume`` every
    iteration. ``push(job, request id)``: the stage's fenced hand back (``to_decode``, ``to_prefill``);
    False: nothing written (the run is over or someone else's, or the claimer must keep it)."""

    def __init__(self, runtime: Runtime, prefetch: Prefetch, push: Callable[[J, str], bool]) -> None:
        self.r, self.prefetch, self.push = runtime, prefetch, push
        self.owed: int | None = None  # tokens of the smallest request handed back since the pools last had room
        self._shared_at = 0.0  # the last ``share``'s hand back (monotonic)
        # the tickets handed back, each with its push's time (monotonic), their messages still held (so
        # this worker, paused, takes none) till ``hold_s`` after it: a peer's queue read takes them meanwhile
        self.held: list[tuple[Ticket[J], float]] = []
        self.hold_s = runtime.settings.lease_s / 4
        self._failed = OutageLog(  # (a line each: 4 a second at a 1 s lease while Redis refuses writes)
            log,
            "hand back failed (%s): the requests left wait here",
            "%d more hand backs failed on Redis since the last line: the requests left wait here",
            "hand backs go through again; they failed over %.1f s (%d more failed since the last line)",
            # (a walk pushes only with a peer's room: the next push may come long after the outage)
            to_last_failure=True,
        )

    def consume(self, busy: bool) -> None:
        """Take messages unless something was handed back that the pools could not hold yet (with
        nothing holding blocks, they could); each message handed back is let go ``hold_s`` after its push."""
        if self.held:
            now = time.monotonic()
            for ticket, _ in [(t, at) for t, at in self.held if now - at >= self.hold_s]:
                ticket.done.set()  # its task ends, its message is acked: a slot of the prefetch is free
            self.held = [(t, at) for t, at in self.held if now - at < self.hold_s]
        if self.owed is not None and (not busy or self.r.pools.fits(self.owed)):
            self.owed = None
        self._pause()

    def _pause(self) -> None:
        """Take no message while something handed back waits for blocks here. Peers read the gauge
        (``_peer_room``): a paused worker has no room for them, whatever blocks its snapshot shows
        free (they handed it requests it never read, and took them back themselves: a bounce)."""
        self.prefetch.pause(self.owed is not None)
        self.r.stats.set(intake_paused=int(self.owed is not None))

    def share(
        self, waiting: list[Ticket[J]], tokens: Callable[[J], int], heartbeat: Heartbeat, held: Container[str]
    ) -> list[Ticket[J]]:
        """For a loop whose waiting requests may hold blocks here (prefill's): ``consume`` every
        iteration, ``hand_back`` a few times per lease those of ``waiting`` not ``held`` (requests
        that hold blocks here: a duplicate delivery of one under way, or of a handoff kept: never a
        second run of it). -> those still waiting, in admission order."""
        self.consume(busy=bool(held))
        now = time.monotonic()
        if not waiting or now - self._shared_at < self.r.settings.lease_s / 4:
            return waiting
        self._shared_at = now
        first_come(waiting)
        free = [t for t in waiting if t.job.request.request_id not in held]
        handed = {id(t) for t in free} - {id(t) for t in self.hand_back(free, tokens, heartbeat)}
        return [t for t in waiting if id(t) not in handed]

    def hand_back(self, waiting: list[Ticket[J]], tokens: Callable[[J], int], heartbeat: Heartbeat) -> list[Ticket[J]]:
        """Hand the waiting requests (in admission order) that this worker cannot admit and a peer has
        room for back to the stage's queue; -> those still waiting. ``tokens``: what a job reserves;
        ``heartbeat``: the loop's, beating the claims."""
        here, blocks_of = _free(self.r.pools.usage()), self.r.pools.layout.blocks_of
        needs = [blocks_of(tokens(ticket.job)) for ticket in waiting]
        room: list[dict[str, int]] | None = None  # the peers' (read once one is wanted)
        still, withheld = [], False
        for ticket, need in zip(waiting, needs, strict=True):
            if here is not None and _take(here, need):  # admitted here next, first come first served
                still.append(ticket)
                continue
            room = self._peer_room() if room is None else room
            peer = next((free for free in room if _take(free, need)), None)
            try:
                if peer is not None and not withheld:  # (before the walk's first push)
                    self.prefetch.withhold(self.r.store.r)
                    withheld = True
                handed = peer is not None and self._hand_back(ticket, heartbeat)
                if peer is not None:
                    self._failed.back()
            except redis.RedisError as exc:  # (raised, it would leave those already handed back waiting too)
                self._failed.failed(exc)
                room, handed = [], False  # (one pushed all the same, its reply lost: a second run is stale)
            if not handed:
                still.append(ticket)
                here = None  # it waits here: so does every later one no peer takes
                continue
            total = tokens(ticket.job)
            self.owed = total if self.owed is None else min(self.owed, total)
        if withheld:
            self._pause()  # (the snapshot this beat writes says so)
        return still

    def _peer_room(self) -> list[dict[str, int]]:
        """Free blocks per pool of each live peer with nothing waiting that takes messages, from its
        last snapshot: a peer paused since its own hand back reads none, whatever blocks it shows free.
        Its snapshot is up to a beat old, and the arrivals it reads meanwhile take its blocks before
        what this worker hands it (1 in ~60 hand-backs of bench/handback_decode.py: the request waited
        there, first in line, till a peer had room): the blocks of what it admitted over its last beat
        (``admitted_blocks``, each request's own: N arrivals hold N windows, not the one of their
        tokens together) count as gone since."""
        registry, settings = self.r.registry, self.r.settings
        peers = [p for p in registry.live_workers(self.r.stats.stage, settings.lease_s) if p != self.r.name]
        room = []
        for snap in registry.snapshots_of(peers).values():
            gauges = snap.get("gauges", {})
            if any(gauges.get(gauge) for gauge in ("waiting_requests", "intake_paused")):
                continue
            free = _free(snap.get("pools", {}))
            room.append({kind: n - int(gauges.get(admitted_blocks(kind), 0)) for kind, n in free.items()})
        return room

    def _hand_back(self, ticket: Ticket[J], heartbeat: Heartbeat) -> bool:
        job = ticket.job
        rid = job.request.request_id
        heartbeat.release(rid)  # no beat in flight outlives the claim
        pushed = False
        try:
            with continued(job.request.trace):  # its message's task span joins the request's trace
                pushed = self.push(job, rid)
        finally:
            if not pushed:  # still this worker's (or its run is over: the take will say so; a beat renews
                heartbeat.hold([rid], {rid: job.attempt})  # no lease a push that raised may have dropped)
        if pushed:
            log.info("request %s: handed back to the %s queue for a worker with room", rid, self.r.stats.stage)
            self.held.append((ticket, time.monotonic()))
        return pushed


def let_go(room: Room | None) -> None:
    """Stopping: the tasks of the tickets ``room`` handed to peers (``Room.held``: their messages held a
    while, else let go by ``consume``, which no loop calls now) end now, not at the grace."""
    for ticket, _ in room.held if room is not None else []:
        ticket.done.set()


class Arrivals:
    """What a decode worker admitted over its current beat, as its peers read it (``Room.hand_back``'s
    estimate of their room): the tokens (``dayzero_admitted_tokens``) and the blocks per pool
    (``admitted_blocks``) of its arrivals, each request's own (N arrivals hold N windows, not one)."""

    def __init__(self, layout: PoolLayout) -> None:
        self.layout = layout
        self.tokens, self.blocks = 0, dict.fromkeys(layout.blocks_of(0), 0)

    def add(self, tokens: int) -> None:
        """A request reserving ``tokens`` was admitted."""
        self.tokens += tokens
        for kind, n in self.layout.blocks_of(tokens).items():
            self.blocks[kind] += n

    def gauges(self) -> dict[str, int]:
        """The beat's gauges, for the worker's snapshot; the next beat counts from none."""
        gauges = {"admitted_tokens": self.tokens, **{admitted_blocks(kind): n for kind, n in self.blocks.items()}}
        self.tokens, self.blocks = 0, dict.fromkeys(self.blocks, 0)
        return gauges


def admitted_blocks(pool: str) -> str:
    """The gauge of a decode worker's blocks in ``pool`` held by the requests it admitted over its
    last beat (not exported: peers read it from its snapshot)."""
    return f"admitted_blocks_{pool}"


def _free(usage: dict[str, Any]) -> dict[str, int]:
    """Free blocks per pool, from (used, total) per pool."""
    return {kind: total - used for kind, (used, total) in usage.items()}


def _take(free: dict[str, int], need: dict[str, int]) -> bool:
    """Take ``need`` out of ``free`` if it holds it."""
    if any(free.get(kind, 0) < n for kind, n in need.items()):
        return False
    for kind, n in need.items():
        free[kind] -= n
    return True
