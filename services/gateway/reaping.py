"""The gateway's reaper: its passes over the requests of every gateway on the Redis (re-runs, no-worker
and overdue ends, cancels left by a stopped gateway), a task of the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis
from starlette.concurrency import run_in_threadpool

from dayzero.redis_refusals import RefusedCredentials
from dayzero.serving import redis_clock as clock
from dayzero.serving.gateways import gone_after_s, stamp
from dayzero.serving.keys import QUEUES
from dayzero.serving.liveness import STAMP_RETRY_S, wake_stampers
from dayzero.serving.messages import PrefillJob
from dayzero.serving.no_worker_count import count_again, unserved_stages
from dayzero.serving.queue import rerun_messages
from dayzero.serving.reaper import OverdueWaits, end_unserved, lock_left_s, sweep
from dayzero.serving.watching import cancel_left

from .context import Gateway
from .pass_steps import PassSteps
from .refused_commands import RefusedCommands
from .sent_commands import PassCommands, SentCommands

log = logging.getLogger("dayzero.gateway")
RERUN_TRANSIT_S = 30.0  # a re-run's mark until its message is pushed: a sweep's round trips, with room
RERUN = "re-run"  # the step that sweeps: skipped for a lease after a failed pass, and while another gateway sweeps
# The workers' stamps after Redis's return come within a stamp's retry and its round trip: a stage a
# reaper pass first finds past its no-worker bound is looked at again this long after, and ends nothing before.
RESTAMPED_S = 2 * STAMP_RETRY_S


async def in_thread(call: Callable, *args: object) -> object:
    """``call(*args)`` in the thread pool; cancelled, this returns once the thread has (a cancel ended
    the await at once, the thread ran on: the reaper's stamp in flight at a gateway's stop landed
    after its leave of the gateways, and counted it running for ``GONE_MIN_S``)."""
    running = asyncio.ensure_future(run_in_threadpool(call, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait({running})
        if not running.cancelled():
            running.exception()  # (its failure, Redis down at the stop, is retrieved: no "never retrieved" line)
        raise


async def reap(gw: Gateway) -> None:
    """Re-run requests whose worker stopped heartbeating, end those waiting at a stage that no live
    worker has served for DAYZERO_NO_WORKER_TIMEOUT_S, or waiting anywhere in a queue past
    DAYZERO_TASK_TIME_LIMIT_S (see dayzero.serving.reaper); cancel those a stopped gateway's clients
    left and have not come back for within the grace (dayzero.serving.watching), once this gateway has
    run for a grace itself: a client of the only gateway cannot resume while it restarts, and a restart
    longer than the grace (4-6 s against 5 s under load) had their requests cancelled at its first pass,
    before they could come back. A pass that failed on Redis (down, frozen, refusing writes: no
    worker could stamp) begins the no-worker counts again at the next, those of the stages a worker
    served before the outage (no_worker_count.count_again). What waits at a stage ends ``no_worker``
    only at a pass that finds it past its bound after one that did too (none when that one failed),
    and the pass after one that first finds a stage so comes ``RESTAMPED_S`` later: a worker ready
    during an outage, at a stage none served before it, stamps within a retry of Redis's return, and
    a pass before that stamp took its stage for unserved (the outage in its count) and ended what
    waited there; the first pass after an outage the reaper saw (5 of 49 rounds), or the first after
    one wholly between two passes, which no pass saw fail. That pass wakes the workers whose stamps
    back off after a long refusal (liveness.wake_stampers): they stamp again before the next. Nothing
    is re-run for a lease after a failed pass (or one Redis answered a quarter lease late: frozen within
    the command timeout, it fails nothing): a live worker's lease that lapsed in the outage is its to
    take back (lease.py); re-run at once, each outage past a lease cost a re-prefill per request. Its start
    and each pass stamp this gateway among those on the Redis (dayzero.serving.gateways: alone, a cancel Redis
    refused goes at once), in a thread a cancel waits for (``in_thread``: the stop's leave comes after);
    its other steps go on their own (pass_steps.py)."""
    messages = rerun_messages(gw.bus.celery)
    store = gw.bus.store
    overdue = OverdueWaits(store, gw.settings.task_time_limit_s, gw.codec)

    def send(job: PrefillJob, stage: str) -> None:
        store.enqueue(job.request.request_id, stage, messages[stage](job), gw.settings.visibility_timeout_s)

    def one_pass(past_before: set[str], rerun: bool, back_since: float, this_pass: PassCommands) -> set[str]:
        """One pass; ``past_before``: the stages past the no-worker bound at the last one. -> those now.
        ``back_since``: when its passes came back from one that failed on Redis (gateways.stamp). The
        stamp goes last: as the pass's first command it took a frozen Redis's stall, the sweep's own
        read answered at once, and it re-ran a live worker's lease that lapsed in the freeze. A pass
        Redis answered with a refusal stamps too (an ACL's NOPERM at a step of every pass: the gateway
        serves on, a resume may come to it, and it never stamped; writes refused: nobody stamps)."""
        with sent.recording(this_pass):  # (the stamp too: its refusal is cleared by its answer alone)
            try:
                past = steps_of_a_pass(past_before, rerun, this_pass)
            except redis.ResponseError:
                with contextlib.suppress(redis.RedisError):
                    stamp(store.r, gw.bus.gateway, clock.now(), back_since, gone_after_s(period))
                raise
            stamp(store.r, gw.bus.gateway, clock.now(), back_since, gone_after_s(period))
        return set(past)

    def counted_again(failed_at: float, this_pass: PassCommands) -> None:
        """``count_again``, its commands recorded as the pass's: a refusal met in it (its script's),
        unrecorded, was never seen answered once the ACL allowed it, held till it lapsed."""
        with sent.recording(this_pass):
            count_again(store.r, QUEUES, failed_at)

    def swept_next(rerun: bool, wait_s: float, this_pass: PassCommands) -> float:
        """The wait before the next pass: to the sweep's lock's lapse where this one found it another's
        and held a refusal met under it (it met that refusal only at the sweeps it won: lifted, it was
        said for as long as its passes took to drift into the lock's lapse, 40 periods on a fresh
        gateway, 503s throughout). One round trip more, only then; one of the pass's commands, before it
        settles (read after, its answer went unsettled: a refusal of it cleared only by its lapse). Its
        refusal (PTTL, an ACL's NOPERM) is met and the wait kept: raised, it failed a pass whose steps had
        gone through (counted an outage: re-runs off for a lease, the no-worker counts begun again)."""
        if not (rerun and RERUN in command.held_at(this_pass)):
            return wait_s
        with sent.recording(this_pass):
            try:
                return min(wait_s, lock_left_s(store.r))
            except redis.ResponseError as exc:
                if not command.tried(exc, this_pass.sent_as(exc)):
                    raise
                return wait_s

    def steps_of_a_pass(past_before: set[str], rerun: bool, this_pass: PassCommands) -> dict[str, float]:
        swept = None  # (skipped, another gateway's, or failed otherwise: it told nothing of a refusal met there)
        if rerun:
            with this_pass.at(RERUN):  # (Stalled: failed)
                swept = steps.run(
                    RERUN, sweep, store, send, RERUN_TRANSIT_S, int(period * 900), 10 * period, period / 2
                )
        if swept is None:
            this_pass.skipped.add(RERUN)
        unserved, bound = unserved_stages(store.r, QUEUES), gw.settings.no_worker_timeout_s
        past = {stage: seconds for stage, seconds in unserved.items() if seconds > bound}
        if past.keys() - past_before:  # (looked at again RESTAMPED_S on: its workers backing off stamp now)
            wake_stampers(store.r)
        gw.bus.unserved = {stage: seconds for stage, seconds in past.items() if stage in past_before}  # (admission)
        steps.run("end of overdue waits", overdue.end)  # (first: the cancelled waits, an unserved stage's among them)
        steps.run("end of unserved waits", end_unserved, store, lambda stage: gw.bus.unserved.get(stage, 0.0), bound)
        if time.time() >= started + gw.settings.disconnect_grace_s:  # (left by a gateway that stopped)
            steps.run("cancel of left requests", cancel_left, store.r, store.ttl_s)
        return past

    period, started, steps = gw.settings.lease_s / 2, time.time(), PassSteps()
    refused = RefusedCredentials(gw.settings.credentials_refused_s, "gateway")  # (its passes: 503s for ever)
    # (NOPERM: no exit, a restart meets the same ACL; the record shared by the gateways on the Redis)
    command, sent = RefusedCommands(gw.settings.redis_url, store.r, period), SentCommands(store.r)
    failed_at = None  # when the first of the passes that failed on Redis failed (Redis's time; count_again)
    wait_s, past, rerun_from = period, set(), 0.0  # (the stages past the bound at the last pass; monotonic)
    back_since = clock.now()  # (Redis's time)
    # among the gateways at once (its first pass is a period away): meanwhile another gateway whose cancel
    # Redis refused took itself for the only one and cancelled at once what a resume here could take
    with contextlib.suppress(redis.RedisError):  # (Redis down or refusing writes: the passes stamp it)
        await in_thread(stamp, store.r, gw.bus.gateway, back_since, back_since, gone_after_s(period))
    while True:
        await asyncio.sleep(wait_s)
        this_pass = PassCommands()  # (those Redis answered in the pass: a refusal of one is cleared)
        try:
            if failed_at is not None:
                rerun_from = time.monotonic() + gw.settings.lease_s  # (the live workers beat within a lease)
                back_since = clock.now()
                await in_thread(counted_again, failed_at, this_pass)
            rerun = time.monotonic() >= rerun_from
            found = await in_thread(one_pass, past, rerun, back_since, this_pass)
            wait_s, past, failed_at = RESTAMPED_S if found - past else period, found, None
            refused.taken()
            wait_s = await in_thread(swept_next, rerun, wait_s, this_pass)
            await in_thread(command.settle, this_pass)
        except redis.RedisError as exc:  # Redis down or refusing writes: /ready says so; sweep when it is back
            if command.tried(exc, this_pass.sent_as(exc)):
                await in_thread(command.settle, this_pass)
            else:
                refused.tried(exc)  # (its credentials refused for DAYZERO_CREDENTIALS_REFUSED_S: the gateway exits 3)
            failed_at = clock.now() if failed_at is None else failed_at  # (its own pass counted before)
            wait_s, past = period, set()
            gw.bus.unserved = {}  # (admissions check no count until the next pass)
        except Exception:  # nobody awaits this task: ended, it would re-run and end nothing again
            wait_s = period
            log.exception("the reaper's pass failed; the next one runs in %.1f s", period)
        gw.command_refused = command.reason
