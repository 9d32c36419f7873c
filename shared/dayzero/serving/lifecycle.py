"""A request's life in Redis: its states, every key that holds them, and the only functions that
move a request from one state to the next (the token stream's: token_stream.py, the re-runs':
reruns.py, its bases). No other module writes these keys but watching.py, the gateway's asynchronous
side of the same transitions, and parked.py the bytes a stage parks (kvstate, handoff.py's).

    admit ─> queued ─> [vision] ─> prefill ─> handed off ─> decoding ─> finished
               ^          │           │           │  ^          │     ├─> cancelled
               │          │           │           │  └ hand back┤     │
               │          └───────────┴───────────┴─────────────┴─────┴─> failed
               └── rerun: a lease lapsed (its worker died) or a stopping worker gave it up; the tokens
                   already streamed go with it

state          keys (prefix ``dz:``)
queued         req:{id} the request JSON, images:{id} its image bytes, active (the set of unfinished
               ids), access:{id} who may read it, queued:{id} until a stage claims it ("{queue}:{n}",
               its message gone once pushed:{queue}, their count, less the queue's length reaches n;
               lapses with the broker's visibility timeout); orphan:{id} the mark of a message a
               sweep found taken off its queue and unclaimed (the next such sweep re-runs the request)
vision,        lease:{id} = the worker, kept alive by heartbeats; attempt:{id} the run it is on (an
prefill,       older delivery is stale); spared:{id} its runs stopping workers gave up, their loops
decoding       ended (no failure: MAX_ATTEMPTS counts the others)
handed off     handoff:{id} ("decode:{n}", counted as queued marks are) and lease:{id} = "handoff":
               prefill's blocks wait for decode to take them (decode's claim takes the lease; a
               claimer whose pools cannot hold it yet may hand it back: the same lease and mark,
               till the handoff's own deadline); kvstate:{id} the state itself when it travels
               through Redis (living on with a claimer's lease: TAKE, HEARTBEAT); taken:{prefill
               worker} the inbox where decode says it has taken them
ended          done:{id} = finished (stop, length) | cancelled | error (a stream ended already: its
               finish); tokens:{id} closed (once: stream_scripts.py; left open: the gateway ends its
               readers by done, with the end unclosed:{id} keeps); kvstate:{id} dropped
any            tokens:{id} the token stream (dayzero.serving.records): only the current run (its
               attempt; the lease its own or nobody's) appends to it, each index once and none
               skipped, or ends the request; cancel:{id} a cancel request, watchers:{id} its readers

The keys that are no request's (the workers', the gateways'): keys.py.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

import redis
from opentelemetry import trace
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from ..redis_clients import sync_client
from .admission import Queue, Record, admission
from .keys import HANDOFF_OWNER, key
from .messages import GenerationRequest
from .queue_scripts import ADMIT, ENQUEUE, RERUN, RERUN_HELD
from .records import ending
from .reruns import Reruns
from .scripts import (
    HAND_BACK,
    HAND_OFF,
    HAND_ON,
    HEARTBEAT,
    RELEASED,
    TAKE,
    TAKE_HANDOFFS,
    Take,
    parked_state,
    push_keys,
)
from .stream_scripts import APPEND, SETTLE, SETTLED_SAYS, Settled, entry_args
from .token_stream import TokenStream

log = logging.getLogger("dayzero.serving")


class Lifecycle(TokenStream, Reruns):
    """The transitions over one synchronous Redis client (the stages, the gateway's thread pool); the
    token stream's: ``TokenStream``; the re-runs': ``Reruns``."""

    def __init__(self, client: redis.Redis, stream_ttl_s: int = 600) -> None:
        self.r, self.ttl_s = client, stream_ttl_s
        self._admit, self._take = client.register_script(ADMIT), client.register_script(TAKE)
        self._heartbeat, self._hand_off = client.register_script(HEARTBEAT), client.register_script(HAND_OFF)
        self._rerun, self._enqueue = client.register_script(RERUN), client.register_script(ENQUEUE)
        self._take_handoffs, self._hand_back = client.register_script(TAKE_HANDOFFS), client.register_script(HAND_BACK)
        self._append, self._settle = client.register_script(APPEND), client.register_script(SETTLE)
        self._hand_on, self._released = client.register_script(HAND_ON), client.register_script(RELEASED)
        self._rerun_held = client.register_script(RERUN_HELD)
        self._read_inbox: dict[str, list[bytes]] = {}  # per holder: the ids its last ``released`` read

    def load_scripts(self) -> None:
        """Load the Lua scripts now, not on a request's way (a first call finds one missing, loads it
        and calls again: two more round trips; after a Redis restart the next call still does).
        The workers do it before they announce themselves, so before the gateway is ready."""
        for script in [value for value in vars(self).values() if isinstance(value, Script)]:  # every one
            self.r.script_load(script.script)

    @classmethod
    def connect(cls, url: str, stream_ttl_s: int = 600) -> Lifecycle:
        once_more = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))  # Redis closed the connection
        client = sync_client(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=5, retry=once_more)
        return cls(client, stream_ttl_s)

    # -- admit: -> queued ---------------------------------------------------------------------------
    def admit(self, request: GenerationRequest, images: list[bytes], reader: str, queued_s: float) -> None:
        """Record the request, its images' bytes and the digest of who may read its stream; queued
        (its message is the caller's to send)."""
        queue = Queue("vision" if images else "prefill")
        keys, args = admission([Record.of(request)], images, reader, queued_s, self.ttl_s, queue)
        self._admit(keys=keys, args=args)

    def request(self, rid: str) -> GenerationRequest | None:
        raw = self.r.get(key("req", rid))
        return GenerationRequest.model_validate_json(raw) if raw else None

    def images(self, rid: str) -> list[bytes]:
        return list(self.r.lrange(key("images", rid), 0, -1))

    # -- a stage takes it: queued -> vision | prefill -------------------------------------------------
    def take(
        self, rid: str, attempt: int, owner: str, lease_s: float, handed_off: bool = False, parked: bool = False
    ) -> Take:
        """Unless the delivery is stale (an older run's, or the request ended), own the request unless
        someone else alive does (the owner may take it again; ``handed_off``: decode, from the
        handoff, whose mark stays till ``take_handoffs``; ``parked``: its state may wait in Redis, kept
        alive with the lease), then whether it was cancelled: one round trip."""
        keys = [key(family, rid) for family in ("attempt", "done", "lease", "queued", "cancel", *parked_state(parked))]
        args = [attempt, owner, int(lease_s * 1000), HANDOFF_OWNER if handed_off else ""]
        taken = Take(self._take(keys=keys, args=args))
        trace.get_current_span().add_event("claimed", {"dayzero.take": taken.name})  # (the task's; bench/overhead.py)
        return taken

    def enqueue(self, rid: str, queue: str, message: str, queued_s: float) -> None:
        """Queued again with ``message`` on ``queue`` (vision -> prefill, a re-run), its lease dropped
        so that the stage may claim it: one atomic step."""
        keys = [queue, key("pushed", queue), key("queued", rid), key("lease", rid)]
        self._enqueue(keys=keys, args=[message, int(queued_s * 1000)])

    def hand_on(
        self, rid: str, attempt: int, owner: str, queue: str, message: str, queued_s: float, front: bool = False
    ) -> bool:
        """``enqueue``, fenced: vision's run ``attempt`` goes on to ``queue`` (prefill's goes back, ``front``:
        where the next read takes it, room.py). False, nothing written: the run is over or someone
        else's (a late one would drop a re-run's lease)."""
        args = [attempt, owner, message, int(queued_s * 1000), "1" if front else ""]
        return bool(self._hand_on(keys=push_keys(rid, "queued", queue), args=args))

    def heartbeat(
        self, rids: list[str], owner: str, lease_s: float, runs: Mapping[str, int], parked: Collection[str] = ()
    ) -> list[str]:
        """Refresh the leases ``owner`` holds (and the states of those ``parked``: still waiting in Redis), take back
        lapsed ones of ``runs`` (id -> its attempt) not re-run since; -> those of ``rids`` it lost (re-run, ended,
        gone with Redis's data): never another's."""
        if not rids:
            return []
        families = ("lease", "attempt", "done", "queued", "req")
        keys, held = [key(family, rid) for rid in rids for family in families], [runs.get(rid, "") for rid in rids]
        parked = parked if isinstance(parked, (set, frozenset)) else set(parked)  # (each lease looked up in it)
        states = [(i, rid) for i, rid in enumerate(rids, 1) if rid in parked]
        keys += [key("kvstate", rid) for _, rid in states]
        lost = self._heartbeat(keys=keys, args=[owner, int(lease_s * 1000), len(rids), *held, *(i for i, _ in states)])
        return [rids[int(i) - 1] for i in lost]

    def owner(self, rid: str) -> str | None:
        raw = self.r.get(key("lease", rid))
        return raw.decode() if raw else None

    # -- prefill -> handed off -> decoding -------------------------------------------------------------
    def hand_off(self, rid: str, attempt: int, owner: str, ttl_s: float, queue: str, message: str) -> bool:
        """Prefill's blocks stay leased to the request until decode takes them (or this expires), and
        ``message`` (decode's job) goes onto ``queue``: one atomic step, so a worker that dies or
        loses Redis in between leaves no handoff without its job. False, nothing written: this run
        is over (the request ended, or its lease lapsed and it was re-run); a handoff then would
        take the lease from the new run, and decode would drop the old run's job as stale."""
        args = [attempt, owner, int(ttl_s * 1000), message, HANDOFF_OWNER]
        return bool(self._hand_off(keys=push_keys(rid, "handoff", queue), args=args))

    def hand_back(self, rid: str, attempt: int, owner: str, queue: str, message: str, least_s: float) -> bool:
        """A decode worker (``owner``) claimed the handoff of run ``attempt`` and cannot hold it yet: the
        handoff waits at ``queue``'s front again with ``message`` for another worker, leased to it till its own
        deadline, as when prefill handed it off. False, nothing written: the run is over or someone
        else's, or less than ``least_s`` of the handoff is left (the claimer keeps it). One atomic step."""
        args = [attempt, owner, message, HANDOFF_OWNER, int(least_s * 1000)]
        return bool(self._hand_back(keys=push_keys(rid, "handoff", queue), args=args))

    def take_handoffs(self, handoffs: list[tuple[str, int, str]], owner: str, lease_s: float) -> dict[str, Take]:
        """Decode has imported the states of these (request, attempt, holder) handoffs: decode owns
        each request whose run is still current, and its ``holder`` (the prefill worker whose blocks
        held it, when it kept them; "": none) is told it may free them. -> each one's ``Take``:
        CLAIMED, CANCELLED (a client's mark, read in the same round trip), or STALE (the run is over,
        or someone else holds the lease: nothing written). One atomic round trip."""
        if not handoffs:
            return {}
        keys, args = [], [owner, int(lease_s * 1000), self.ttl_s, HANDOFF_OWNER]
        for rid, attempt, holder in handoffs:
            keys += [key(family, rid) for family in ("attempt", "done", "lease", "handoff", "cancel")]
            keys.append(key("taken", holder))
            args += [attempt, rid if holder else ""]
        answers = self._take_handoffs(keys=keys, args=args)
        return {rid: Take(answer) for (rid, _, _), answer in zip(handoffs, answers, strict=True)}

    def released(self, holder: str, held: Mapping[str, int], lapsed: Collection[str] = ()) -> set[str]:
        """Of the handoffs whose blocks ``holder`` keeps (``held``: request -> attempt), those it may
        free: decode has taken the run held (told through the holder's inbox since the last call: an
        older run's notice, read once the request was re-run and prefilled here again, freed the new
        run's blocks before decode took them), a client cancelled them, their run is over (the request
        ended, or was re-run since: decode died before it took the state), or they are ``lapsed``
        (past their deadline) and no decode worker has claimed them. One round trip (``RELEASED``: an
        inbox's notice leaves it only at the call after the one that read it, so none is lost with a
        reply)."""
        rids = list(held)
        keys = [key("taken", holder)] + [
            key(family, rid) for rid in rids for family in ("cancel", "done", "attempt", "lease")
        ]
        inbox, marks = self._released(keys=keys, args=self._read_inbox.get(holder, []))
        self._read_inbox[holder] = inbox  # (acted on by the caller: they leave the inbox at the next call)
        over = zip(rids, marks[::4], marks[1::4], marks[2::4], marks[3::4], strict=True)
        unclaimed = (None, HANDOFF_OWNER.encode())
        return {rid for rid, run in map(_notice, inbox) if rid in held and run in (held[rid], None)} | {
            rid
            for rid, cancel, done, attempt, lease in over
            if cancel or done or held[rid] < int(attempt or 0) or (rid in lapsed and lease in unclaimed)
        }

    # -- ended: finished | cancelled | failed ----------------------------------------------------------
    def settle(
        self,
        rid: str,
        attempt: int,
        owner: str,
        reason: str,
        end_at: int | None = None,
        message: str = "",
        usage: dict | None = None,
        code: str = "",
        text: str = "",
    ) -> Settled:
        """End the request for run ``attempt`` held by ``owner`` ("": the reaper, nobody's lease): its
        stream closes at ``end_at`` with ``reason`` and ``text`` (None: its last token carried them), it
        leaves the active set, its lease goes; its record stays as long as its stream. STALE (falsy),
        nothing written: the run is over or someone else's (a stalled worker's, re-run since). Any
        other: ended, and how its stream closed (``Settled``; one not CLOSED is logged). One round trip."""
        keys = [key(family, rid) for family in ("attempt", "done", "lease", "tokens", "queued")] + [key("active")]
        keys += [key(family, rid) for family in ("req", "access", "images", "kvstate", "unclosed", "spared")]
        args = [attempt, owner, self.ttl_s, rid, reason]
        if end_at is not None:
            args += entry_args(ending(rid, end_at, reason, message, usage, code, text))
        settled = Settled(self._settle(keys=keys, args=args))
        if settled not in (Settled.STALE, Settled.CLOSED):
            trace.get_current_span().add_event("stream_end", {"dayzero.settled": settled.name})
            level = logging.ERROR if settled == Settled.UNCLOSED else logging.WARNING
            log.log(level, "request %s ended %s at %s: its stream's end %s", rid, reason, end_at, SETTLED_SAYS[settled])
        return settled

    def done(self, rid: str) -> str | None:
        raw = self.r.get(key("done", rid))
        return raw.decode() if raw else None

    def cancel(self, rid: str) -> None:
        self.r.set(key("cancel", rid), 1, ex=self.ttl_s)

    def cancelled(self, rids: list[str]) -> set[str]:
        if not rids:
            return set()
        marks = self.r.mget([key("cancel", rid) for rid in rids])
        return {rid for rid, mark in zip(rids, marks, strict=True) if mark}


def _notice(notice: bytes) -> tuple[str, int | None]:
    """An inbox's notice (TAKE_HANDOFFS) -> the request, the run decode took (None: an older version's)."""
    rid, _, run = notice.decode().rpartition(" ")
    return (rid, int(run)) if rid else (run, None)
