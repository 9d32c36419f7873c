"""The reaper against a real Redis: what it re-runs, and what it ends instead."""

from __future__ import annotations

import time

import redis

from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.params import SamplingParams
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.reaper import MAX_ATTEMPTS, OverdueWaits, end_unserved, sweep
from dayzero.serving.records import Token
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import wait_until
from .prefill_jobs import handed_off


def test_a_request_whose_worker_died_after_streaming_its_end_is_ended_not_re_run(redis_url):
    """Its last token carried the finish; the worker died before recording the end. A re-run would
    generate past the end the client already read; the reaper records the end instead. A request
    whose worker died mid-stream is re-run from the tokens streamed."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    for rid in ("r-ended", "r-midway"):
        request = GenerationRequest(
            request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0.0
        )
        store.admit(request, [], "", 60)
        store.take(rid, 0, "decode0", 30)
        store.append([Token(rid, 0, 7, "a")], {rid: 0}, "decode0")
        store.r.delete(key("lease", rid))  # the worker died
    store.append([Token("r-ended", 1, 8, "b", finish_reason="length")], {"r-ended": 0}, "decode0")
    rerun = sweep(store, lambda job, stage: sent.append(job), 60, 1, 60)
    assert "r-ended" not in rerun and store.done("r-ended") == "length"
    assert "r-ended" not in store.active() and not store.r.exists(key("queued", "r-ended"))
    assert "r-midway" in rerun and [job.generated for job in sent if job.request.request_id == "r-midway"] == [(7,)]


def test_a_re_run_whose_message_was_never_pushed_is_re_run_again_after_its_transit(redis_url):
    """The reaper marks a re-run queued, then pushes its message. A gateway that dies in between
    leaves a mark with no message behind it: the mark holds for the transit (a sweep's round trips,
    with room; the gateway passes 30 s), not the broker's visibility timeout, and the first sweep
    after it re-runs the request again."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    request = GenerationRequest(
        request_id="r-transit", prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0.0
    )
    store.admit(request, [], "", 60)
    store.take("r-transit", 0, "prefill0", 30)
    store.r.delete(key("lease", "r-transit"))  # the worker died
    assert "r-transit" in sweep(store, lambda job, stage: None, 0.3, 1, 60)  # marked; the gateway died
    time.sleep(0.01)  # the sweep lock's 1 ms
    assert "r-transit" not in sweep(store, lambda job, stage: sent.append(job), 0.3, 1, 60)  # in transit
    time.sleep(0.4)
    assert "r-transit" in sweep(store, lambda job, stage: sent.append(job), 0.3, 1, 60)
    assert [job.attempt for job in sent if job.request.request_id == "r-transit"] == [2]


def test_a_request_that_lost_its_worker_too_often_ends_with_an_error_in_the_log(redis_url, caplog):
    """Its runs keep killing their workers: past MAX_ATTEMPTS the reaper ends it rather than
    re-running it again, and says so under its id."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    request = GenerationRequest(request_id="r-cursed", prompt_ids=(0, 5), sampling=SamplingParams(), created=0.0)
    store.admit(request, [], "", 60)
    store.take("r-cursed", 0, "decode0", 30)
    store.r.set(key("attempt", "r-cursed"), MAX_ATTEMPTS)  # its earlier runs were lost the same way
    store.r.delete(key("lease", "r-cursed"))  # the worker died
    assert sweep(store, lambda job, stage: sent.append(job), 60, 1, 60) == [] and not sent
    assert store.done("r-cursed") == "error"
    assert "request r-cursed lost its worker" in caplog.text


def test_a_request_its_client_left_is_ended_cancelled_not_re_run_nor_failed(redis_url):
    """The client left (a cancel mark). Its request whose worker died is ended cancelled, not re-run
    (the next stage's claim would only end it, one queue trip later); one waiting at a stage that has
    had no live worker past the bound is ended cancelled, not with no_worker's error (an error
    logged, and a 503 to a reader, for a request nobody wanted any more)."""
    store, sent = Lifecycle(redis.Redis.from_url(redis_url)), []
    for rid in ("r-left-dead", "r-left-stranded", "r-stranded"):
        request = GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(), created=0.0)
        store.admit(request, [], "", 60)
    for rid in ("r-left-stranded", "r-stranded"):
        store.enqueue(rid, "prefill", f"the message of {rid}", 60)  # its message waits on prefill's queue
    store.take("r-left-dead", 0, "decode0", 30)
    store.append([Token("r-left-dead", 0, 7, "a")], {"r-left-dead": 0}, "decode0")
    store.r.delete(key("lease", "r-left-dead"))  # the worker died
    store.cancel("r-left-dead")
    store.cancel("r-left-stranded")
    rerun = sweep(store, lambda job, stage: sent.append(job), 60, 1, 60)
    assert "r-left-dead" not in rerun and all(job.request.request_id != "r-left-dead" for job in sent)
    assert store.done("r-left-dead") == "cancelled" and store.stream("r-left-dead") == ([7], "cancelled")
    assert "r-stranded" in end_unserved(store, lambda stage: 100.0, 60)
    assert store.done("r-left-stranded") is None  # (cancelled: OverdueWaits' to end, first in each pass)
    assert OverdueWaits(store, 3600, IdsOnlyCodec()).end() == ["r-left-stranded"]
    assert store.done("r-left-stranded") == "cancelled" and store.done("r-stranded") == "error"
    (_, stranded), *_ = store.r.xrevrange(key("tokens", "r-stranded"), count=1)
    (_, left), *_ = store.r.xrevrange(key("tokens", "r-left-stranded"), count=1)
    assert stranded[b"c"] == b"no_worker" and b"c" not in left and left[b"f"] == b"cancelled"


def test_a_request_cancelled_while_it_waits_in_a_queue_ends_at_the_next_pass_not_at_its_lease_s_lapse(
    demo_dir, redis_url
):
    """Its client left while the request waited on a queue no worker read yet: a handoff behind a busy
    decode stage (its state in Redis, its lease DAYZERO_HANDOFF_TIMEOUT_S: 600 s here), a prompt on
    prefill's. Nothing ended them till a worker's claim, or the lease's lapse and the sweep after:
    the handoff's state, record and open stream stayed for the handoff's timeout. The reaper's next
    pass ends each cancelled (the handoff after prefill's token) and drops the state; a handoff its
    client still reads waits on, and a decode worker's late take of the cancelled one is stale."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", handoff_timeout_s=600)
    store, sent = handed_off(settings, ("w-left", "w-read"))
    queued = GenerationRequest(request_id="w-queued", prompt_ids=(0, 5), sampling=SamplingParams(), created=time.time())
    store.admit(queued, [], "", 60)
    store.enqueue("w-queued", "prefill", "the message of w-queued", 60)
    for rid in ("w-left", "w-queued"):
        store.cancel(rid)
    assert store.owner("w-left") == HANDOFF_OWNER and store.r.exists(key("kvstate", "w-left"))
    assert sorted(OverdueWaits(store, 3600, IdsOnlyCodec()).end()) == ["w-left", "w-queued"]
    first = next(job.generated[0] for job in sent if job.request.request_id == "w-left")
    assert store.stream("w-left") == ([first], "cancelled") and store.stream("w-queued") == ([], "cancelled")
    assert store.done("w-left") == store.done("w-queued") == "cancelled"
    assert not store.r.exists(key("kvstate", "w-left")) and {"w-left", "w-queued"}.isdisjoint(store.active())
    assert store.done("w-read") is None and store.owner("w-read") == HANDOFF_OWNER
    assert store.r.exists(key("kvstate", "w-read"))
    handoffs = [(job.request.request_id, job.attempt, job.state.holder) for job in sent]
    assert store.take_handoffs(handoffs, "decode0", 30) == {"w-left": Take.STALE, "w-read": Take.CLAIMED}


def test_the_gateway_s_reaper_outlives_a_pass_that_fails(demo_dir, redis_url, monkeypatch, caplog):
    """The reaper is a task nobody awaits: a pass that raised anything but a Redis error ended it for
    good (no re-run, no time limit, no no-worker end again, nothing said). It logs and passes again."""
    from fastapi.testclient import TestClient

    from services.gateway import app, reaping

    passes = []

    def failing_once(*args) -> list[str]:
        passes.append(args)
        if len(passes) == 1:
            raise RuntimeError("a bug in one pass")
        return []

    monkeypatch.setattr(reaping, "sweep", failing_once)
    with TestClient(app.make_app(Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.1))):
        assert wait_until(lambda: len(passes) >= 3, 30)
    assert "the reaper's re-run failed" in caplog.text and "a bug in one pass" in caplog.text


def test_a_reaper_step_that_fails_every_pass_skips_none_after_it_and_is_logged_once(
    demo_dir, redis_url, monkeypatch, caplog
):
    """The end of the cancelled and overdue waits raised at every pass (a bug, a record it cannot
    read): the steps after it in the pass (the no-worker ends, the cancels a stopped gateway left)
    never ran, and the trace was logged every pass. Each step goes on its own now, the failure
    logged once."""
    from fastapi.testclient import TestClient

    from services.gateway import app, reaping

    class FailingWaits:
        def __init__(self, *args) -> None:
            pass

        def end(self) -> list[str]:
            raise RuntimeError("a record the pass cannot read")

    unserved_passes, left_passes = [], []
    monkeypatch.setattr(reaping, "OverdueWaits", FailingWaits)
    monkeypatch.setattr(reaping, "end_unserved", lambda *args: unserved_passes.append(args))
    monkeypatch.setattr(reaping, "cancel_left", lambda *args: left_passes.append(args))
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.1, disconnect_grace_s=0)
    with caplog.at_level("WARNING", "dayzero.gateway"), TestClient(app.make_app(settings)):
        assert wait_until(lambda: len(unserved_passes) >= 3 and len(left_passes) >= 3, 30)
    logged = [record for record in caplog.records if "the reaper's end of overdue waits failed" in record.getMessage()]
    assert len(logged) == 1 and "a record the pass cannot read" in caplog.text


def test_a_re_run_drops_the_state_its_dead_run_parked_in_redis(demo_dir, redis_url):
    """handoff=redis: a decode worker claimed a handoff and died before it imported the state (its
    lease lapsed). The reaper's re-run made that run's state one nobody reads, and it stayed in Redis
    for the handoff's timeout (600 s here), or till the new run's prefill parked anew. The re-run,
    in the same step that ends the old run (its attempt bumped: fenced), drops it."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", handoff_timeout_s=600)
    store, [job] = handed_off(settings, ("dead-claimer",))
    kvstate = key("kvstate", "dead-claimer")
    assert store.take("dead-claimer", job.attempt, "decode0", 0.2, handed_off=True, parked=True) == Take.CLAIMED
    assert wait_until(lambda: not store.r.exists(key("lease", "dead-claimer")), 10)  # (no beat: died)
    assert store.r.pttl(kvstate) > 60_000  # (the handoff's timeout: nobody reads it)
    assert store.rerun_orphan("dead-claimer", 60, 60) == job.attempt + 1
    assert not store.r.exists(kvstate)
