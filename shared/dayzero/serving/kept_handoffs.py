"""A prefill worker's handoffs to decode: the attention state published, the request on decode's
queue; the blocks of those whose state stays here until decode has copied it (every transport but
Redis), and when to free them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from ..kv.pools import OutOfBlocks
from ..telemetry import tracer
from .handoff import publish
from .messages import DecodeJob, PrefillJob
from .parked import drop_parked
from .runtime import Runtime

log = logging.getLogger("dayzero.prefill")
TAKEN_POLL_S = 0.01  # a stopping worker asks this often whether decode took what it keeps (a round trip each)


class KeptHandoffs:
    def __init__(self, runtime: Runtime) -> None:
        self.r = runtime
        self.held: dict[str, tuple[float, int]] = {}  # request -> when its handoff lapses (monotonic), attempt

    def hand_off(self, job: PrefillJob, decode_message: Callable[[DecodeJob], str]) -> None:
        """Publish the state of ``job``'s prompt (its first token streamed, last of ``generated``) and
        queue the request for decode (``decode_message``: a job -> its message): its blocks kept here
        till decode has copied them, else released (the state travels in Redis, or the run is over)."""
        rid, store, settings = job.request.request_id, self.r.store, self.r.settings
        with tracer.start_as_current_span("kv.export", attributes={"dayzero.transport": settings.handoff}):
            start = time.perf_counter()
            ref = publish(
                self.r.pools, rid, rid, settings.handoff, store, settings.handoff_timeout_s, settings.handoff_ids
            )
            self.r.stats.add(handoff_seconds=time.perf_counter() - start)
        kept = settings.handoff != "redis"  # the state stays in this worker's blocks till decode has it
        if kept:
            ref = ref.model_copy(update={"holder": self.r.name})  # decode says when it has taken it
        message = decode_message(
            DecodeJob(request=job.request, generated=job.generated, state=ref, attempt=job.attempt)
        )
        if not store.hand_off(rid, job.attempt, self.r.name, settings.handoff_timeout_s, "decode", message):
            if not kept:
                drop_parked(store, ref.location)
            self.drop_over(rid)
        elif kept:
            self.keep(rid, job.attempt)
        else:
            self.r.ranks.release(rid)  # the state travels in Redis: nothing to keep

    def drop_over(self, rid: str) -> None:
        """A run of the request found over (its lease lapsed and it was re-run, or it ended): its blocks go."""
        log.warning("request %s: its lease lapsed and it was re-run (or it ended): dropping this run", rid)
        self.r.ranks.release(rid)

    def keep(self, rid: str, attempt: int) -> None:
        self.held[rid] = (time.monotonic() + self.r.settings.handoff_timeout_s, attempt)

    def holds(self, rid: str, attempt: int) -> bool:
        """Whether this worker holds blocks of ``rid`` for run ``attempt`` or a later one (under way,
        or a handoff decode has not taken): a delivery of it waits till they are free. Those of an
        older run's handoff are released (decode drops its job as stale)."""
        if rid not in self.r.pools.sequences:
            return False
        held = self.held.get(rid)
        if held is None or held[1] >= attempt:
            return True
        self.forget(rid)
        self.r.ranks.release(rid)
        return False

    def reserve(self, rid: str, tokens: int) -> None:
        """``rid``'s blocks (raises OutOfBlocks); when none are free, first those of handoffs decode
        has taken since the last batch."""
        try:
            self.r.ranks.reserve(rid, tokens)
        except OutOfBlocks as exc:
            if exc.permanent or not self.reclaim():
                raise
            self.r.ranks.reserve(rid, tokens)

    def forget(self, rid: str) -> None:
        """No longer kept (the caller releases its blocks)."""
        self.held.pop(rid, None)

    def reclaim(self) -> bool:
        """Release blocks whose handoff decode has taken (or that lapsed unclaimed, or whose request a
        client cancelled, ended or re-ran); whether any were. A handoff decode claimed keeps its
        blocks past its timeout: decode copies them once its pools have room (a re-run, should
        decode die, frees them)."""
        freed = self._let_go()
        for rid in freed:
            self.r.ranks.release(rid)
        return bool(freed)

    def wait_taken(self, until: float) -> None:
        """Stopping (its loop ended, its ranks stopped): wait till decode has taken every handoff kept here
        (or it is over, as ``reclaim`` frees them), till ``until`` (monotonic) at most: the blocks go with
        the process, and decode's attach of one not taken fails (a lease's lapse and a re-run later).
        Redis failing ends the wait (those left go to the reaper, as they did)."""
        try:
            while self.held:  # asked once at least (``until`` past): decode took some since the loop's last reclaim
                self._let_go()  # (not released: the other ranks stopped listening, the process ends)
                if not self.held or time.monotonic() >= until:
                    break
                time.sleep(TAKEN_POLL_S)
        except redis.RedisError as exc:
            log.warning("%d handoffs decode has not taken are left to the reaper: %s", len(self.held), exc)
            return
        if self.held:
            log.warning("%d handoffs decode has not taken by the stop are left to the reaper", len(self.held))

    def _let_go(self) -> list[str]:
        """The handoffs no longer kept (``reclaim``'s), out of ``held``; their blocks still held."""
        if not self.held:
            return []
        now = time.monotonic()
        lapsed = {rid for rid, (deadline, _) in self.held.items() if deadline < now}
        free = self.r.store.released(self.r.name, {rid: attempt for rid, (_, attempt) in self.held.items()}, lapsed)
        for rid in lapsed - free:  # a decode worker claimed it: asked again a lease later
            self.held[rid] = (now + self.r.settings.lease_s, self.held[rid][1])
        return [rid for rid in free if self.held.pop(rid, None) is not None]
