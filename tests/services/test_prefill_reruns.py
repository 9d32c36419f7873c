"""The prefill loop in-process against a real Redis: leases and re-runs (a request a worker holds is
leased to it, re-run when the worker dies, and a stale run leaves the request to its re-run; one
retried after Redis failed at its handoff goes on after the token it streamed)."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted, one_sequence_loop


def test_a_request_waiting_in_a_worker_is_leased_to_it_and_re_run_when_it_dies(demo_dir, redis_url):
    """Delivered requests are claimed at once, before the loop reaches them, and stay leased to the
    worker (its heartbeat) while they wait for the loop or for blocks, with no queued mark. When the
    worker dies, the lease lapses and the reaper re-runs the request. Marked queued instead, the
    reaper would leave it for the broker's visibility timeout (an hour): without ack emulation the
    broker never delivers a dead worker's messages again."""
    from dayzero.serving.reaper import sweep

    settings = Settings(
        checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=1, handoff_timeout_s=600, lease_s=0.3
    )
    loop = PrefillLoop(Runtime.load(settings, "prefill10@test", "prefill", False), recording([]))
    loop.r.warm_up(decode=False)  # as a worker does before it serves: no kernel compiles inside the leases
    store, name = Lifecycle.connect(redis_url), loop.r.name
    tickets = [loop.intake.submit(admitted(store, rid)) for rid in ("early", "late")]
    assert [store.owner(rid) for rid in ("early", "late")] == [name, name]  # claimed on delivery
    assert not store.r.exists(key("queued", "early"), key("queued", "late"))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        time.sleep(1.2)  # four leases
        assert tickets[0].done.is_set() and not tickets[1].done.is_set()  # "late" waits for blocks
        assert store.owner("late") == name and not store.r.exists(key("queued", "late"))
    finally:
        loop.stop.set()  # the worker dies: no more heartbeats
        thread.join(5)
    time.sleep(0.5)
    reruns = []
    swept = sweep(store, lambda job, stage: reruns.append(job), 60, 1, 60)  # (and the module's leftovers)
    assert "late" in swept and "early" not in swept  # "early" waits for decode
    assert [job.attempt for job in reruns if job.request.request_id == "late"] == [1]


def test_leases_live_until_each_request_of_a_slow_batch_is_handed_on(demo_dir, redis_url, monkeypatch):
    """A batch whose handoffs take longer than a lease: every request is still leased to this worker
    when its turn comes (a lapsed lease lets the reaper re-run a request being handed to decode)."""
    import dayzero.serving.kept_handoffs as kept_handoffs

    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.3)
    runtime = Runtime.load(settings, "prefill3@test", "prefill", False)
    runtime.warm_up(decode=False)  # as a worker does before it serves: no kernel compiles inside the leases
    store, owners, real_publish = Lifecycle.connect(redis_url), {}, kept_handoffs.publish

    def slow_publish(pools, seq_id, request_id, *args):
        owners[request_id] = store.owner(request_id)
        time.sleep(0.25)  # a slow handoff: six of them outlast the lease several times over
        return real_publish(pools, seq_id, request_id, *args)

    monkeypatch.setattr(kept_handoffs, "publish", slow_publish)
    loop = PrefillLoop(runtime, recording([]))
    jobs = []
    for i in range(6):
        request = GenerationRequest(
            request_id=f"slow{i}",
            prompt_ids=(0, 5 + i, 6, 7),
            sampling=SamplingParams(max_tokens=4),
            created=time.time(),
        )
        store.admit(request, [], "", 60)
        jobs.append(PrefillJob(request=request))
    run_jobs(loop, jobs, 60)
    assert owners == {f"slow{i}": runtime.name for i in range(6)}
    assert all(store.owner(f"slow{i}") == "handoff" for i in range(6))  # no late beat overwrote a handoff lease


def test_a_batch_hands_on_only_the_requests_it_claims(demo_dir, redis_url):
    """A cancelled request, a stale delivery and one a live worker owns, batched with a fresh one
    (their claims may come back only after the forward): only the fresh one streams a token and
    goes to decode, the cancelled one ends as cancelled, and the others' blocks are free again."""
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill5@test", "prefill", False)
    sent: list[DecodeJob] = []
    store, ids = Lifecycle.connect(redis_url), ("fresh", "left", "old", "elsewhere")
    requests = [
        GenerationRequest(
            request_id=rid, prompt_ids=(0, 5, 6, 7), sampling=SamplingParams(max_tokens=4), created=time.time()
        )
        for rid in ids
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    store.cancel("left")
    store.r.set(key("attempt", "old"), 1)  # re-run since: this delivery (attempt 0) is stale
    store.take("elsewhere", 0, "prefill9@live", 30)
    run_jobs(PrefillLoop(runtime, recording(sent)), [PrefillJob(request=r) for r in requests])
    assert [job.request.request_id for job in sent] == ["fresh"]
    assert [store.done(rid) for rid in ids] == [None, "cancelled", None, None]  # "fresh" is decode's now
    assert [len(store.streamed_tokens(rid)) for rid in ids] == [1, 0, 0, 0]
    assert store.owner("elsewhere") == "prefill9@live"
    assert set(runtime.pools.sequences) == {"fresh"}  # leased to decode; nothing else held


def test_a_failed_forward_ends_only_the_requests_it_claimed(demo_dir, redis_url, monkeypatch):
    import dayzero.serving.prefill_batch as prefill_batch

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(prefill_batch, "prefill_step", broken)
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill6@test", "prefill", False)
    store = Lifecycle.connect(redis_url)
    requests = [
        GenerationRequest(
            request_id=rid, prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=4), created=time.time()
        )
        for rid in ("mine", "theirs")
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    store.take("theirs", 0, "prefill9@live", 30)
    run_jobs(PrefillLoop(runtime, recording([])), [PrefillJob(request=r) for r in requests])
    assert store.done("mine") == "error" and store.done("theirs") is None  # its owner's to end
    assert store.owner("theirs") == "prefill9@live" and runtime.pools.sequences == {}


def test_a_run_whose_lease_lapsed_and_was_re_run_leaves_the_request_to_the_re_run(demo_dir, redis_url, monkeypatch):
    """The lease lapses mid-prefill (a stalled worker) and the reaper re-runs the request. The old
    run must not hand off: its handoff would take the lease from the new run (which then finds the
    request owned and drops it) while decode drops the old run's job as stale, and the request would
    hang until the handoff lapsed. The old run frees its blocks; the re-run goes to decode."""
    import dayzero.serving.kept_handoffs as kept_handoffs
    from dayzero.serving.reaper import sweep

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill8@test", "prefill", False)
    store, reruns, real_publish = Lifecycle.connect(redis_url), [], kept_handoffs.publish
    store.r.delete("decode")

    def stalled(pools, seq_id, request_id, *args):
        store.r.delete(key("lease", request_id))  # it lapsed, and the reaper's next sweep re-runs it
        assert request_id in sweep(store, lambda job, stage: reruns.append(job), 60, 1, 60)  # (and leftovers)
        return real_publish(pools, seq_id, request_id, *args)

    monkeypatch.setattr(kept_handoffs, "publish", stalled)
    job = admitted(store, "lapsed")
    run_jobs(PrefillLoop(runtime, recording([])), [job])
    assert store.r.llen("decode") == 0 and not store.r.exists(key("handoff", "lapsed"))
    assert store.owner("lapsed") is None and store.r.exists(key("queued", "lapsed"))  # the re-run's to take
    assert "lapsed" not in runtime.pools.sequences
    [rerun] = [job for job in reruns if job.request.request_id == "lapsed"]
    assert rerun.attempt == 1 and len(rerun.generated) == 1  # the first token was streamed already
    monkeypatch.setattr(kept_handoffs, "publish", real_publish)
    sent: list[DecodeJob] = []
    run_jobs(PrefillLoop(runtime, recording(sent)), [rerun])
    assert [job.attempt for job in sent] == [1] and store.r.llen("decode") == 1
    assert store.owner("lapsed") == "handoff"


def test_a_stalled_runs_tokens_after_its_re_run_are_refused_and_the_re_run_streams_its_own(demo_dir, redis_url):
    """The reaper re-ran the request and read its stream; the old run, stalled rather than dead,
    tries to stream two more tokens before it notices. They are refused: the stream stays as the
    reaper read it, and the re-run continues from there (were they written, the re-run's first token
    would take an index already streamed, and the client would read the old run's text while the
    model went on from another)."""
    from dayzero.serving.records import Token

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill9@test", "prefill", False)
    store, sent = Lifecycle.connect(redis_url), []
    job = admitted(store, "stalled")
    assert store.take("stalled", 0, "prefill8@test", 0.05) == Take.CLAIMED  # the old run's claim
    time.sleep(0.1)  # it stalls past its lease
    assert store.rerun_orphan("stalled", 60, 60) == 1  # nobody holds it: the reaper re-runs it (attempt 1)
    late = [Token("stalled", 0, 11, "a"), Token("stalled", 1, 12, "b")]
    assert store.append(late, {"stalled": 0}, "prefill8@test").refused == {"stalled"}  # the old run's
    run_jobs(PrefillLoop(runtime, recording(sent)), [job.model_copy(update={"attempt": 1})])
    [handed] = sent
    assert handed.attempt == 1 and len(handed.generated) == 1
    assert store.streamed_tokens("stalled") == list(handed.generated)


def test_a_re_run_of_a_request_whose_handoff_it_still_holds_runs_again(demo_dir, redis_url):
    """Prefill still holds the blocks of a handoff when the reaper re-runs the request (decode took
    its message off the queue and died before claiming it). The re-run's delivery prefills again
    and hands off in the old handoff's blocks. Dropped as a duplicate, it would stay claimed, its
    lease kept alive by the heartbeat, and the request would never end."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill11@test")
    store = Lifecycle.connect(redis_url)
    store.r.delete("decode", key("pushed", "decode"))
    job = admitted(store, "again")
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert loop.intake.submit(job).done.wait(30) and "again" in loop.r.pools.sequences
        assert not loop.r.pools.fits(5)  # the old handoff holds the pools' one sequence
        assert store.r.rpop("decode")  # decode took the message, and died
        assert store.rerun_orphan("again", 60, 60) == 0  # sighted: its claim may be on its way
        assert store.rerun_orphan("again", 60, 60) == 1  # still unclaimed at the next sweep
        rerun = job.model_copy(update={"attempt": 1, "generated": tuple(store.streamed_tokens("again"))})
        assert loop.intake.submit(rerun).done.wait(30)
    finally:
        loop.stop.set()
        thread.join(5)
    assert [(job.attempt, len(job.generated)) for job in sent] == [(0, 1), (1, 1)]  # (decode feeds its token)
    assert len(store.streamed_tokens("again")) == 1  # the re-run's prefill samples none
    assert store.owner("again") == "handoff" and store.r.llen("decode") == 1


def test_a_delivery_no_run_takes_frees_its_parked_image_embeddings(demo_dir, redis_url):
    """Image embeddings parked by the vision stage are read once by the prefill run they were
    parked for. An older run's delivery (a re-run encodes the images again) and one whose request
    ended carry embeddings nobody will read: freed at once (they stayed in shared memory for the
    broker's visibility timeout). A duplicate delivery of a run another worker holds leaves them
    to it."""
    import torch

    from dayzero.serving.parked import publish_tensor
    from dayzero.shm import SHM_DIR

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill9@test", "prefill", False)
    loop, store = PrefillLoop(runtime, recording([])), Lifecycle.connect(redis_url)
    jobs = {rid: admitted(store, rid) for rid in ("older-run", "ended", "held-elsewhere")}
    store.r.set(key("attempt", "older-run"), 1)  # re-run since: this delivery is attempt 0's
    store.settle("ended", 0, "", "cancelled")
    store.r.set(key("lease", "held-elsewhere"), "prefill8@test:abc")
    parked = {}
    for rid, job in jobs.items():
        ref = publish_tensor(torch.ones(2, 64), rid, "shm", store, 600)
        parked[rid], jobs[rid] = SHM_DIR / ref.location, job.model_copy(update={"embeddings": ref})
    try:
        run_jobs(loop, list(jobs.values()), 30)
        assert not parked["older-run"].exists() and not parked["ended"].exists()
        assert parked["held-elsewhere"].exists()  # its owner reads it
    finally:
        for path in parked.values():
            path.unlink(missing_ok=True)


def test_a_retry_after_redis_failed_at_the_handoff_continues_after_the_streamed_token(demo_dir, redis_url):
    """Redis fails as the first token is out and the handoff is not: the retry must know the token
    went out. Run past the time limit meanwhile, the request ends "length" after that token, its
    stream closed (it ended as one that streamed nothing, at index 0, where the token already was:
    no end entry was written, the stream never closed nor expired); else its handoff goes again, of
    the state its prefill kept (not prefilled again)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, task_time_limit_s=1)
    runtime = Runtime.load(settings, "prefill-late@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    real_hand_off = runtime.store.hand_off

    def hand_off_failing(rid, *args):
        if rid == "overdue-retry":
            time.sleep(1.2)  # past the time limit by the retry
            raise redis.ConnectionError("Redis went away")  # the first token landed; the handoff did not
        return real_hand_off(rid, *args)

    runtime.store.hand_off = hand_off_failing
    store = Lifecycle.connect(redis_url)
    run_jobs(loop, [admitted(store, "overdue-retry")], 30)
    tokens, finish = store.stream("overdue-retry")
    assert (len(tokens), finish, store.done("overdue-retry")) == (1, "length", "length")
    sent.clear()  # (the messages made: the failed handoff's too)
    on_time = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill-on@test", "prefill", False)
    retried, failing = PrefillLoop(on_time, recording(sent)), [True]

    def hand_off_failing_once(rid, *args):
        if failing.pop() if failing else False:
            raise redis.ConnectionError("Redis went away")
        return real_on_time(rid, *args)

    real_on_time, on_time.store.hand_off = on_time.store.hand_off, hand_off_failing_once
    prefills, real_prefill = [], on_time.ranks.prefill
    on_time.ranks.prefill = lambda chunks: prefills.append(len(chunks)) or real_prefill(chunks)
    run_jobs(retried, [admitted(store, "on-time-retry")], 30)
    assert store.streamed_tokens("on-time-retry") == list(sent[-1].generated)
    # the retry hands off the state it kept, after the streamed token (was: prompt + token prefilled again,
    # and a second token sampled and streamed by prefill)
    assert len(sent[-1].generated) == 1 and prefills == [1]
