"""Re-run requests whose worker died: a lapsed lease means nobody is working on it; end those
that wait at a stage no live worker serves, or past DAYZERO_TASK_TIME_LIMIT_S.

The re-run carries the tokens already streamed, so the new prefill continues where the
stream stopped; stream entry ids derived from the token index make any replayed append a
no-op, and the attempt counter makes a late redelivery of the old task stale.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable

import redis

from ..ids_only_codec import IdsOnlyCodec
from ..redis_refusals import command_refused
from ..telemetry import continued
from ..tokenizer import TextCodec
from .keys import QUEUES, key
from .lifecycle import Lifecycle
from .messages import PrefillJob
from .time_limit import overdue, past_limit

log = logging.getLogger("dayzero.reaper")
MAX_ATTEMPTS = 4
# the sweep's lock deleted where it holds ``ARGV[1]`` (its taker's: one taken since is another's)
GIVE_BACK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
LOCK_LAPSE_MARGIN_S = 0.001  # (PTTL is in whole ms: a try that came before the lapse tries again at once)


class Stalled(redis.RedisError):
    """Redis answered a sweep's first round trips late: frozen a while, the workers' beats waited too."""


def sweep(
    store: Lifecycle,
    send: Callable[[PrefillJob, str], None],
    transit_s: float,
    lock_ms: int,
    sighting_s: float,
    stalled_s: float | None = None,
) -> list[str] | None:
    """One pass over the unfinished requests; returns the ids re-enqueued (None: another gateway holds
    the sweep's lock, nothing was looked at). ``stalled_s``: Redis
    answering the lock and the list of requests later than this raises ``Stalled``, nothing re-run
    (a freeze within the client's timeout fails no call: a lease that lapsed in it is its worker's).

    ``send(job, stage)`` queues a re-run (``Lifecycle.enqueue``): at the vision stage when the
    request has images. Until it does, the re-run's queued mark holds for ``transit_s``: a gateway
    that dies in between leaves a request the next sweep after that re-runs again. A message a
    worker took off its queue and never claimed is re-run by the next sweep that finds it so
    within ``sighting_s`` (above the sweeps' period): the first may be just ahead of a live claim.
    A command refused its user (an ACL's NOPERM) before the sweep looked at a request gives the lock
    back (``_give_back``); after, it is kept: a sighting among those looked at is re-run by the next
    sweep, which the lock keeps a period away (given back, another gateway's at once re-ran a message
    whose live worker's claim was just behind its pop: prefilled twice).
    """
    began, token = time.monotonic(), secrets.token_hex(8)
    if not store.r.set(key("reaper"), token, px=lock_ms, nx=True):  # one gateway sweeps at a time
        return None  # another gateway swept just now
    looked: list[str] = []  # the requests whose re-run step ran (a first sighting among them)
    try:
        return _rerun_orphans(store, send, transit_s, sighting_s, stalled_s, began, looked)
    except redis.RedisError as exc:
        if command_refused(exc) and not looked:
            _give_back(store.r, token)
        raise


def _give_back(r: redis.Redis, token: str) -> None:
    """The sweep's lock, where still this sweep's (``token``), given back: its user was refused a
    command, which another gateway's may run. Kept (0.9 of a period), nobody swept that period: the
    refused gateway's pass timed to the lock's lapse (``lock_left_s``) won a third of the sweeps, each
    refused. A refusal of this too leaves the lock to lapse."""
    with contextlib.suppress(redis.RedisError):
        r.register_script(GIVE_BACK)([key("reaper")], [token])


def _rerun_orphans(
    store: Lifecycle,
    send: Callable[[PrefillJob, str], None],
    transit_s: float,
    sighting_s: float,
    stalled_s: float | None,
    began: float,
    looked: list[str],
) -> list[str]:
    """``sweep``'s pass under its lock (taken at ``began``, monotonic); each request whose re-run step
    ran goes to ``looked``."""
    active, took = store.active(), time.monotonic() - began
    if stalled_s is not None and took > stalled_s:
        raise Stalled(f"Redis answered the sweep's first round trips in {took:.1f} s")
    rerun_ids = []
    for rid in active:
        attempt = store.rerun_orphan(rid, transit_s, sighting_s)
        looked.append(rid)
        if attempt and rerun(store, send, rid, attempt, "lost its worker"):
            rerun_ids.append(rid)
    return rerun_ids


def rerun(store: Lifecycle, send: Callable[[PrefillJob, str], None], rid: str, attempt: int, why: str) -> bool:
    """Send run ``attempt`` of the request (its re-run step taken: ``Lifecycle.rerun_orphan``, ``rerun_held``)
    from the tokens its stream holds to its first stage (vision with images), or end it: its stream ended,
    its client cancelled it, or its runs failed MAX_ATTEMPTS times (``why``: what befell it, logged). Whether
    it was sent."""
    request = store.request(rid)
    if request is None:
        return False
    tokens, ended = store.stream(rid)
    if ended:  # its worker died after streaming the end, before recording it: nothing to re-run
        store.settle(rid, attempt, "", ended)
        return False
    generated = tuple(tokens)
    if store.cancelled([rid]):  # its client left: no run for it (the next stage would end it)
        store.settle(rid, attempt, "", "cancelled", len(generated))
        return False
    if attempt - store.spared(rid) > MAX_ATTEMPTS:  # (failed runs: a clean stop's hand back is none)
        log.error("request %s %s, %d runs in all; ending it with an error", rid, why, attempt)
        store.settle(rid, attempt, "", "error", len(generated), "the request failed on several workers")
        return False
    log.warning("request %s %s; re-running from token %d (attempt %d)", rid, why, len(generated), attempt)
    job = PrefillJob(request=request, generated=generated, attempt=attempt)
    with continued(request.trace):  # its message's task span, and the stages' spans, join its trace
        send(job, "vision" if request.images else "prefill")
    return True


def lock_left_s(r: redis.Redis) -> float:
    """How long the sweep's lock is held yet (0: free). A gateway that tries it then wins the sweep
    before its holder's next try (a tenth of a period on, at the same lease): trying a period after
    the last, it won only where its pass happened to fall in that tenth. A lock without an expiry (PTTL
    -1: set by hand) never lapses: inf (read as free, the next pass came 1 ms on, lost, for as long as it
    stayed: 387 passes in 2 s where a period's wait made 10)."""
    left_ms = r.pttl(key("reaper"))
    return math.inf if left_ms == -1 else max(left_ms, 0) / 1000 + LOCK_LAPSE_MARGIN_S


def no_worker_message(stage: str, unserved_s: float, bound_s: float) -> str:
    return (
        f"no {stage} worker has been ready to take the request for {unserved_s:.0f} s "
        f"(DAYZERO_NO_WORKER_TIMEOUT_S={bound_s:g}); retry later"
    )


def end_unserved(store: Lifecycle, unserved_s: Callable[[str], float], bound_s: float) -> list[str]:
    """End the requests waiting in the queue of a stage that has had no serving worker (alive and
    ready) for over ``bound_s`` (``unserved_s(stage)``: for how long; liveness.py): 503
    ``no_worker``, a stream's error event. One its client cancelled is ``OverdueWaits``' to end (as
    cancelled, not a failure to report: each pass runs it first). A request waiting behind others on a
    live worker is never ended here. Returns their ids."""
    over = {stage: since for stage in QUEUES if (since := unserved_s(stage)) > bound_s}
    if not over:
        return []
    ended, waiting = [], store.waiting(store.active())
    cancelled = store.cancelled([rid for rid, (stage, _, _) in waiting.items() if stage in over])
    for rid, (stage, attempt, owner) in waiting.items():
        if stage not in over or rid in cancelled:
            continue
        tokens, _ = store.stream(rid)
        message = no_worker_message(stage, over[stage], bound_s)
        if store.settle(rid, attempt, owner, "error", len(tokens), message, code="no_worker"):
            log.error("request %s: %s", rid, message)
            ended.append(rid)
    return ended


def end_cancelled(store: Lifecycle, rid: str, attempt: int, owner: str) -> bool:
    """End run ``attempt`` of a waiting request (``owner``: who ``settle`` names for it) its client
    cancelled, after the tokens it streamed (a handoff's first); whether it ended."""
    return bool(store.settle(rid, attempt, owner, "cancelled", len(store.streamed_tokens(rid))))


class OverdueWaits:
    """Ends the requests that wait in a stage's queue (vision's, prefill's, decode's as a handoff no
    decode worker has taken, or one handed back): at once those their client cancelled, the others
    once they are past ``limit_s`` from their admission. A worker ends those it has claimed
    (waiting.py, decode_loop.py); these, nobody until a worker takes their message: a handoff
    cancelled behind a busy decode stage kept its record, its open stream and, through Redis, its
    state's bytes till its lease lapsed (DAYZERO_HANDOFF_TIMEOUT_S); with no worker taking them (a
    stage without one, or with every one stuck), for ever. Each one's admission time is read once
    (its record may be large: a long prompt) and remembered while it waits."""

    def __init__(self, store: Lifecycle, limit_s: float, codec: TextCodec | IdsOnlyCodec) -> None:
        self.store, self.limit_s, self.codec = store, limit_s, codec  # (codec: thinking mode's usage)
        self._created: dict[str, float] = {}  # waiting request -> its admission (unix time)

    def end(self) -> list[str]:
        """One pass: one its client cancelled as cancelled (the next stage's claim would only end it,
        once its message's turn came), the others past the limit as time_limit.py says ("length" with
        the tokens streamed, a handoff's first among them; none: 503 ``overloaded``); each fenced as
        every end (a worker that claims one meanwhile ends it itself). Returns their ids."""
        store, waiting = self.store, self.store.waiting(self.store.active())
        cancelled = store.cancelled(list(waiting))
        ended = [rid for rid in cancelled if end_cancelled(store, rid, *waiting[rid][1:])]
        self._created = {
            rid: self._created[rid] if rid in self._created else self._admitted(rid)
            for rid in waiting
            if rid not in cancelled
        }
        for rid in [rid for rid, created in self._created.items() if overdue(created, self.limit_s)]:
            (_, attempt, owner), tokens = waiting[rid], store.streamed_tokens(rid)
            request = store.request(rid)
            if request is None:  # its record expired meanwhile (rerun_orphan drops it)
                continue
            end = past_limit(self.codec, request, tokens, self.limit_s)
            if store.settle(rid, attempt, owner, end.reason, end.index, end.message, end.usage, end.code, end.text):
                log.warning("request %s: waited in a queue past DAYZERO_TASK_TIME_LIMIT_S; ended it", rid)
                ended.append(rid)
        return ended

    def _admitted(self, rid: str) -> float:
        request = self.store.request(rid)
        return request.created if request is not None else float("inf")  # (no record: never overdue here)
