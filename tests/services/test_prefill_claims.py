"""A prefill worker's claim of each delivery, against a real Redis and a real prefill loop on its own
thread (the test's thread is the Celery task's): what a refused claim leaves (a stale delivery, an
ended request, one a live worker holds, a cancelled one; Redis refusing the claim, or the worker
stopping meanwhile) is what it left when the claim ran before the loop saw the job: its task acked
(its ticket done), the same Redis state, nothing sent, no request counted, nothing logged. Each runs
with the claim answering at once and after the loop's forward (a slow round trip), the claim's
answer then arriving while the loop already works on the job."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, wait_until
from .prefill_jobs import admitted, one_sequence_loop
from .test_decode_appends import writes_refused

SLOW_CLAIM_S = 0.3  # past the demo model's forward of a short prompt: the answer comes while the loop works
OTHER = "prefill-other@test"


class Worker:
    """A prefill loop on its thread whose claims take ``delay_s`` longer; the jobs it sent to decode."""

    def __init__(self, demo_dir, redis_url: str, name: str) -> None:
        settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff_timeout_s=600)
        self.sent: list[DecodeJob] = []
        self.loop = PrefillLoop(Runtime.load(settings, name, "prefill", False), recording(self.sent))
        self.store, self.delay_s, real_take = self.loop.r.store, 0.0, self.loop.r.store.take

        def take(*args, **kwargs):
            time.sleep(self.delay_s)
            return real_take(*args, **kwargs)

        self.store.take = take  # (the heartbeat's claims go through the runtime's Lifecycle)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.stop.set()
        self.thread.join(30)

    def sent_for(self, rid: str) -> list[DecodeJob]:
        return [job for job in self.sent if job.request.request_id == rid]


@pytest.fixture(scope="module")
def worker(demo_dir, redis_url):
    running = Worker(demo_dir, redis_url, "prefill-claims@test")
    yield running
    running.stop()


def keys_of(store: Lifecycle, rid: str) -> dict:
    """Every key of the request, by its value (not its time to live), and whether it is active."""
    state = {k: store.r.dump(k) for k in store.r.scan_iter(match=f"dz:*:{rid}")}
    return {**state, "active": store.r.sismember(key("active"), rid)}


def uncounted(worker: Worker, before: dict) -> bool:
    """Whether the worker's counters (requests started, steps, tokens prefilled) are those of ``before``."""
    after = worker.loop.r.stats.counters
    return all(after.get(name, 0) == before.get(name, 0) for name in ("queued_requests", "steps", "tokens"))


def refusals(caplog, rid: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and rid in r.getMessage()]


def _stale(store: Lifecycle, rid: str) -> None:
    store.r.set(key("attempt", rid), 1)  # the reaper re-ran it: run 0's delivery is an older run's


def _ended(store: Lifecycle, rid: str) -> None:
    store.settle(rid, 0, "", "cancelled", 0)


def _owned(store: Lifecycle, rid: str) -> None:
    store.take(rid, 0, OTHER, 30)  # a live worker holds it (a duplicate delivery reached this one)


@pytest.mark.parametrize("delay_s", [0.0, SLOW_CLAIM_S], ids=["at-once", "after-the-forward"])
@pytest.mark.parametrize("refusal", [_stale, _ended, _owned], ids=["stale", "ended", "owned"])
def test_a_refused_claim_writes_nothing_sends_nothing_and_acks(worker, caplog, refusal, delay_s):
    rid = f"claim-{refusal.__name__.strip('_')}-{int(delay_s * 1000)}"
    job = admitted(worker.store, rid)
    refusal(worker.store, rid)
    before, counted = keys_of(worker.store, rid), dict(worker.loop.r.stats.counters)
    worker.delay_s = delay_s
    ticket = worker.loop.intake.submit(job)
    assert ticket.done.wait(30)  # the task returns: its message is acked
    assert keys_of(worker.store, rid) == before
    assert worker.sent_for(rid) == [] and rid not in worker.loop.r.pools.sequences  # nothing sent, no block held
    assert uncounted(worker, counted)
    assert refusals(caplog, rid) == []
    _served_next(worker, f"{rid}-next")  # the loop goes on


@pytest.mark.parametrize("delay_s", [0.0, SLOW_CLAIM_S], ids=["at-once", "after-the-forward"])
def test_a_claim_that_finds_its_request_cancelled_ends_it_cancelled_unprefilled(worker, caplog, delay_s):
    rid = f"claim-cancelled-{int(delay_s * 1000)}"
    job = admitted(worker.store, rid)
    worker.store.cancel(rid)
    counted = dict(worker.loop.r.stats.counters)
    worker.delay_s = delay_s
    ticket = worker.loop.intake.submit(job)
    assert ticket.done.wait(30)
    assert worker.store.done(rid) == "cancelled" and worker.store.owner(rid) is None
    assert rid not in worker.store.active() and not worker.store.r.exists(key("queued", rid))
    assert worker.store.streamed_tokens(rid) == []  # its stream closed with no token
    assert worker.sent_for(rid) == [] and rid not in worker.loop.r.pools.sequences
    assert uncounted(worker, counted)
    assert refusals(caplog, rid) == []
    _served_next(worker, f"{rid}-next")


def test_the_first_token_goes_out_only_once_the_claim_took_the_lease(worker):
    """The claim answers after the forward: the first token and the handoff wait for it (appended
    before, the token would land on a request nobody had claimed, queued still: a refusal then
    would leave a token nobody's run wrote)."""
    rid = "claim-slow-claimed"
    seen, real_append = [], worker.store.append

    def append(tokens, *args, **kwargs):
        if any(t.request_id == rid for t in tokens):
            seen.append((worker.store.owner(rid), worker.store.r.exists(key("queued", rid))))
        return real_append(tokens, *args, **kwargs)

    worker.store.append = append
    try:
        worker.delay_s = SLOW_CLAIM_S
        ticket = worker.loop.intake.submit(admitted(worker.store, rid))
        assert ticket.done.wait(30)
    finally:
        del worker.store.append
    assert seen == [(worker.loop.r.name, 0)]  # appended once, claimed by then
    assert [job.request.request_id for job in worker.sent_for(rid)] == [rid]


def test_a_claim_redis_refuses_is_retried_and_its_request_served_once(worker, caplog):
    rid = "claim-refused-by-redis"
    job = admitted(worker.store, rid)
    worker.delay_s = 0.0
    done: list = []
    with writes_refused(worker.store.r):  # out of memory: the claim's write refused
        task = threading.Thread(target=lambda: done.append(worker.loop.intake.submit(job)))
        task.start()
        assert wait_until(lambda: any("retrying the claim of" in m for m in refusals(caplog, rid)), 10)
        assert worker.sent_for(rid) == [] and worker.store.streamed_tokens(rid) == []
    task.join(30)
    assert done and done[0].done.wait(30)
    assert len(worker.store.streamed_tokens(rid)) == 1 and len(worker.sent_for(rid)) == 1
    assert worker.store.owner(rid) != worker.loop.r.name  # handed off: decode's to take


def test_a_claim_given_up_as_its_worker_stops_acks_and_writes_nothing(demo_dir, redis_url, caplog):
    """Redis refusing the claim as the worker stops: the claim gives up, its task returns (its message,
    taken off the queue, unclaimed: the reaper's to re-run), nothing written."""
    stopping = Worker(demo_dir, redis_url, "prefill-claims-stopping@test")
    rid = "claim-given-up"
    job = admitted(stopping.store, rid)
    before, done = keys_of(stopping.store, rid), []
    try:
        with writes_refused(stopping.store.r):
            task = threading.Thread(target=lambda: done.append(stopping.loop.intake.submit(job)))
            task.start()
            assert wait_until(lambda: any("retrying the claim of" in m for m in refusals(caplog, rid)), 10)
            stopping.loop.stop.set()
            task.join(10)
            assert done and done[0].done.wait(10)
    finally:
        stopping.stop()
    assert keys_of(stopping.store, rid) == before and stopping.sent_for(rid) == []


def test_a_refused_claim_of_a_request_waiting_for_blocks_acks_at_once(demo_dir, redis_url):
    """The pools hold one sequence, kept by a handoff decode has not taken: a stale delivery's job
    waits for blocks while its claim answers; it is settled then (acked), not once blocks come free."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill-claims-full@test")
    store = loop.r.store
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert loop.intake.submit(admitted(store, "claim-holds-blocks")).done.wait(30)
        job = admitted(store, "claim-waits-for-blocks")
        _stale(store, "claim-waits-for-blocks")
        before = keys_of(store, "claim-waits-for-blocks")
        assert loop.intake.submit(job).done.wait(10)
        assert keys_of(store, "claim-waits-for-blocks") == before
        assert [job.request.request_id for job in sent] == ["claim-holds-blocks"]
    finally:
        loop.stop.set()
        thread.join(30)


def _served_next(worker: Worker, rid: str) -> None:
    worker.delay_s = 0.0
    assert worker.loop.intake.submit(admitted(worker.store, rid)).done.wait(30)
    assert len(worker.sent_for(rid)) == 1
