"""The prefill loop in-process against a real Redis: a batch that Redis interrupts is retried."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from dayzero.params import SamplingParams
from dayzero.serving.lifecycle import Lifecycle, key
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import recording, run_jobs


def _admitted(store: Lifecycle, rid: str) -> PrefillJob:
    """A five-token request, admitted as the gateway admits it: its prefill job."""
    request = GenerationRequest(
        request_id=rid, prompt_ids=(0, 5, 6, 7, 8), sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    store.admit(request, [], "", 60)
    return PrefillJob(request=request)


def _one_sequence_loop(demo_dir, redis_url, name: str) -> tuple[PrefillLoop, list[DecodeJob]]:
    """A prefill loop whose pools hold one sequence (handoffs wait for decode up to 600 s), and the
    jobs it sends to decode."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=1, handoff_timeout_s=600)
    sent: list[DecodeJob] = []
    return PrefillLoop(Runtime.load(settings, name, "prefill", False), recording(sent)), sent


def test_a_batch_redis_interrupts_is_retried_without_leaking_blocks(demo_dir, redis_url):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill0@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    appends, real_append = [], runtime.store.append

    def append_failing_once(tokens, *args):
        appends.append(tokens)
        if len(appends) == 1:
            raise redis.ConnectionError("Redis went away")  # after the forward, before the first token landed
        return real_append(tokens, *args)

    runtime.store.append = append_failing_once
    store = Lifecycle.connect(redis_url)
    run_jobs(loop, [_admitted(store, "flaky")], 30)
    assert len(appends) == 2 and len(sent) == 1  # retried once, handed to decode once
    assert store.streamed_tokens("flaky") == [sent[0].generated[0]]
    assert set(runtime.pools.sequences) == {"flaky"}  # only the handed-off state: nothing from the failed try
    held = runtime.pools.sequences["flaky"].tables
    assert all(len(held[k]) == runtime.pools.layout.blocks_for(k, 5) for k in held)


def test_a_failed_forward_ends_its_requests_and_frees_their_blocks(demo_dir, redis_url, monkeypatch):
    import dayzero.serving.prefill_batch as prefill_batch

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill1@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(prefill_batch, "prefill", broken)  # the forward itself fails
    store = Lifecycle.connect(redis_url)
    request = GenerationRequest(
        request_id="broken", prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    store.admit(request, [], "", 60)
    run_jobs(loop, [PrefillJob(request=request)], 30)
    assert store.done("broken") == "error" and not sent
    assert runtime.pools.sequences == {}  # its blocks are free again
    (_, last), *_ = store.r.xrevrange("dz:tokens:broken", count=1)
    assert last[b"e"] == b"prefill failed: RuntimeError"


def test_an_image_request_whose_embeddings_are_gone_fails_alone_with_a_clear_error(demo_dir, redis_url):
    import socket

    from dayzero.serving.messages import TensorRef

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill4@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    store = Lifecycle.connect(redis_url)
    request = GenerationRequest(
        request_id="lost-images", prompt_ids=(0, 8, 8, 6), sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    fine = request.model_copy(update={"request_id": "beside-it", "prompt_ids": (0, 5, 6)})
    gone = TensorRef(transport="shm", location="dz-parked-0-gone", host=socket.gethostname(), shape=(2, 64))
    for r in (request, fine):
        store.admit(r, [], "", 60)
    run_jobs(loop, [PrefillJob(request=request, embeddings=gone), PrefillJob(request=fine)], 30)  # one batch
    assert store.done("lost-images") == "error" and "lost-images" not in runtime.pools.sequences
    assert [job.request.request_id for job in sent] == ["beside-it"]  # the rest of its batch goes on
    (_, last), *_ = store.r.xrevrange("dz:tokens:lost-images", count=1)
    assert last[b"e"].startswith(b"its images' embeddings are gone")


def test_identical_prompts_in_a_batch_are_prefilled_once_and_continue_alike(demo_dir, redis_url):
    import torch

    from dayzero.kv.pools import pools_for
    from dayzero.model.forward import decode, prefill

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill2@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    store, same, other = Lifecycle.connect(redis_url), (0, 9, 8, 7, 6, 5, 4, 3, 2), (0, 11, 12)
    jobs = []
    for rid, prompt in (("n0", same), ("n1", same), ("n2", same), ("solo", other)):
        request = GenerationRequest(
            request_id=rid, prompt_ids=prompt, sampling=SamplingParams(max_tokens=4), created=time.time()
        )
        store.admit(request, [], "", 60)
        jobs.append(PrefillJob(request=request))
    run_jobs(loop, jobs, 30)  # queued before the loop runs: one batch
    assert runtime.stats.counters["tokens"] == len(same) + len(other)  # the three copies ran once
    firsts = {job.request.request_id: job.generated[0] for job in sent}
    assert firsts["n0"] == firsts["n1"] == firsts["n2"]

    model = runtime.model
    alone = pools_for(model.cfg, torch.float32, 16)
    prefill(model, alone, ["ref"], [list(same)])
    want = decode(model, alone, ["ref"], [firsts["n0"]])[0]
    got = [decode(model, runtime.pools, [rid], [firsts[rid]])[0] for rid in ("n0", "n1", "n2")]
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])  # the copies hold the same state
    assert (got[0] - want).abs().max().item() < 1e-5  # ... that of a prefill of its own (other batch shapes)


@pytest.mark.parametrize("how", ["decode takes it", "the client leaves"])
def test_prefill_frees_handed_off_blocks_when_decode_takes_them_or_the_request_is_cancelled(demo_dir, redis_url, how):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff_timeout_s=600)
    runtime = Runtime.load(settings, "prefill3@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    store, rid = Lifecycle.connect(redis_url), f"waits-{how[:6]}"
    job = _admitted(store, rid)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert loop.intake.submit(job).done.wait(30)
        assert len(sent) == 1 and rid in runtime.pools.sequences  # leased to decode for up to 600 s
        time.sleep(0.3)
        assert rid in runtime.pools.sequences  # nothing frees them while decode has not taken them
        if how == "decode takes it":
            store.take_handoffs([(rid, 0, sent[0].state.holder)], "decode0@test", 5)
        else:
            store.cancel(rid)  # the client left while the request waited for decode
        deadline = time.time() + 10
        while rid in runtime.pools.sequences and time.time() < deadline:
            time.sleep(0.05)
    finally:
        loop.stop.set()
        thread.join(30)
    assert sent[0].state.holder == runtime.name and rid not in runtime.pools.sequences


def test_a_request_that_finds_the_pools_full_takes_the_blocks_of_a_handoff_decode_took(demo_dir, redis_url):
    """Handed-off blocks are reclaimed after each batch (off the next arrival's path) and, when a
    request finds no free blocks, at once: it is not sent back to wait for the next iteration."""
    loop, sent = _one_sequence_loop(demo_dir, redis_url, "prefill6@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    tickets = []
    try:
        for rid in ("first", "second"):
            tickets.append(loop.intake.submit(_admitted(store, rid)))
            loop._iteration()  # one iteration each, on this thread: no race with the loop's own reclaims
            if rid == "first":
                assert tickets[0].done.is_set() and "first" in runtime.pools.sequences  # held for decode
                assert not runtime.pools.fits(5)  # the pools are full
                store.take_handoffs([("first", 0, sent[0].state.holder)], "decode0@test", 5)
    finally:
        loop.stop.set()  # its heartbeat thread ends with it
    assert tickets[1].done.is_set() and [job.request.request_id for job in sent] == ["first", "second"]
    assert loop.pending == [] and set(runtime.pools.sequences) == {"second"}


def test_the_blocks_of_a_handoff_whose_request_was_re_run_are_freed_at_once(demo_dir, redis_url):
    """Decode took a handoff's message and died before claiming it; the reaper re-ran the request
    (another prefill worker runs it). This worker frees the old handoff's blocks as soon as it
    needs them, not when the handoff lapses (here 600 s): a request that finds the pools full
    runs."""
    loop, sent = _one_sequence_loop(demo_dir, redis_url, "prefill12@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    store.r.delete("decode", key("pushed", "decode"))
    tickets = []
    try:
        tickets.append(loop.intake.submit(_admitted(store, "old-run")))
        loop._iteration()
        assert tickets[0].done.is_set() and "old-run" in runtime.pools.sequences and not runtime.pools.fits(5)
        assert store.r.rpop("decode")  # decode took the message, and died
        assert [store.rerun_orphan("old-run", 60, 60) for _ in range(2)] == [0, 1]  # two sweeps: re-run
        tickets.append(loop.intake.submit(_admitted(store, "next")))
        loop._iteration()
    finally:
        loop.stop.set()
    assert tickets[1].done.is_set() and [job.request.request_id for job in sent] == ["old-run", "next"]
    assert set(runtime.pools.sequences) == {"next"}


def test_a_request_waiting_for_blocks_waits_without_spinning(demo_dir, redis_url):
    """Pools full of a handoff decode has not taken yet: the next request waits for the intake (or
    a reclaim) a few times a second, not in a busy loop, and runs once decode takes it. One that a
    client cancels meanwhile ends without blocks."""
    loop, sent = _one_sequence_loop(demo_dir, redis_url, "prefill7@test")
    store, tries = Lifecycle.connect(redis_url), []
    real_reserve = loop.r.ranks.reserve
    loop.r.ranks.reserve = lambda rid, *args: tries.append(rid) or real_reserve(rid, *args)
    tickets = [loop.intake.submit(_admitted(store, rid)) for rid in ("holds", "waits", "leaves")]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        assert tickets[0].done.is_set() and not tickets[1].done.is_set()  # "waits" finds no blocks
        assert tries.count("waits") <= 25  # a try every ~50 ms, not thousands
        store.cancel("leaves")
        assert tickets[2].done.wait(2) and store.done("leaves") == "cancelled"
        store.take_handoffs([("holds", 0, sent[0].state.holder)], "decode0@test", 5)
        assert tickets[1].done.wait(5)
    finally:
        loop.stop.set()
        thread.join(5)
    assert [job.request.request_id for job in sent] == ["holds", "waits"]


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
    tickets = [loop.intake.submit(_admitted(store, rid)) for rid in ("early", "late")]
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
    import dayzero.serving.prefill_loop as prefill_loop

    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.3)
    runtime = Runtime.load(settings, "prefill3@test", "prefill", False)
    runtime.warm_up(decode=False)  # as a worker does before it serves: no kernel compiles inside the leases
    store, owners, real_publish = Lifecycle.connect(redis_url), {}, prefill_loop.publish

    def slow_publish(pools, seq_id, request_id, *args):
        owners[request_id] = store.owner(request_id)
        time.sleep(0.25)  # a slow handoff: six of them outlast the lease several times over
        return real_publish(pools, seq_id, request_id, *args)

    monkeypatch.setattr(prefill_loop, "publish", slow_publish)
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
        GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6, 7), sampling=SamplingParams(max_tokens=4), created=0.0)
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

    monkeypatch.setattr(prefill_batch, "prefill", broken)
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill6@test", "prefill", False)
    store = Lifecycle.connect(redis_url)
    requests = [
        GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=4), created=0.0)
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
    import dayzero.serving.prefill_loop as prefill_loop
    from dayzero.serving.reaper import sweep

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill8@test", "prefill", False)
    store, reruns, real_publish = Lifecycle.connect(redis_url), [], prefill_loop.publish
    store.r.delete("decode")

    def stalled(pools, seq_id, request_id, *args):
        store.r.delete(key("lease", request_id))  # it lapsed, and the reaper's next sweep re-runs it
        assert request_id in sweep(store, lambda job, stage: reruns.append(job), 60, 1, 60)  # (and leftovers)
        return real_publish(pools, seq_id, request_id, *args)

    monkeypatch.setattr(prefill_loop, "publish", stalled)
    job = _admitted(store, "lapsed")
    run_jobs(PrefillLoop(runtime, recording([])), [job])
    assert store.r.llen("decode") == 0 and not store.r.exists(key("handoff", "lapsed"))
    assert store.owner("lapsed") is None and store.r.exists(key("queued", "lapsed"))  # the re-run's to take
    assert "lapsed" not in runtime.pools.sequences
    [rerun] = [job for job in reruns if job.request.request_id == "lapsed"]
    assert rerun.attempt == 1 and len(rerun.generated) == 1  # the first token was streamed already
    monkeypatch.setattr(prefill_loop, "publish", real_publish)
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
    job = _admitted(store, "stalled")
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
    loop, sent = _one_sequence_loop(demo_dir, redis_url, "prefill11@test")
    store = Lifecycle.connect(redis_url)
    store.r.delete("decode", key("pushed", "decode"))
    job = _admitted(store, "again")
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
    assert [(job.attempt, len(job.generated)) for job in sent] == [(0, 1), (1, 2)]
    assert store.owner("again") == "handoff" and store.r.llen("decode") == 1
