"""The prefill loop in-process against a real Redis: batches, blocks and handoffs (a batch Redis
interrupts is retried, a failed forward frees what it held, handed-off blocks are freed)."""

from __future__ import annotations

import threading
import time

import pytest

from dayzero.params import SamplingParams
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted, first_append_fails, one_sequence_loop


def test_a_batch_redis_interrupts_is_retried_without_leaking_blocks(demo_dir, redis_url):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill0@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    appends = first_append_fails(runtime)
    store = Lifecycle.connect(redis_url)
    run_jobs(loop, [admitted(store, "flaky")], 30)
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

    monkeypatch.setattr(prefill_batch, "prefill_step", broken)  # the forward itself fails
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


def test_identical_prompts_in_a_batch_are_prefilled_once_and_continue_alike(demo_dir, redis_url):
    import torch

    from dayzero.kv.pools import pools_for
    from dayzero.model.forward import decode, prefill

    same, other = (0, 9, 8, 7, 6, 5, 4, 3, 2), (0, 11, 12)
    # the batch's token budget counts the copies once: counted each, they went in three batches
    step = len(same) + len(other)
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, max_prefill_tokens=step, prefill_chunk_size=step)
    runtime = Runtime.load(settings, "prefill2@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    store = Lifecycle.connect(redis_url)
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
    job = admitted(store, rid)
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
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill6@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    tickets = []
    try:
        for rid in ("first", "second"):
            tickets.append(loop.intake.submit(admitted(store, rid)))
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
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill12@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    store.r.delete("decode", key("pushed", "decode"))
    tickets = []
    try:
        tickets.append(loop.intake.submit(admitted(store, "old-run")))
        loop._iteration()
        assert tickets[0].done.is_set() and "old-run" in runtime.pools.sequences and not runtime.pools.fits(5)
        assert store.r.rpop("decode")  # decode took the message, and died
        assert [store.rerun_orphan("old-run", 60, 60) for _ in range(2)] == [0, 1]  # two sweeps: re-run
        tickets.append(loop.intake.submit(admitted(store, "next")))
        loop._iteration()
    finally:
        loop.stop.set()
    assert tickets[1].done.is_set() and [job.request.request_id for job in sent] == ["old-run", "next"]
    assert set(runtime.pools.sequences) == {"next"}


def test_a_handoff_whose_claiming_decode_died_is_freed_once_the_reaper_re_runs_it(demo_dir, redis_url):
    """Decode claimed a handoff (its import may be under way, reading these blocks) and died: its
    lease lapses unrenewed. Prefill cannot tell a dead claimer from a frozen one till the reaper
    re-runs the request (its attempt bumped: a late import is stale), so it keeps the blocks till
    then, and frees them at its next iteration after, not at the handoff's timeout (600 s here)."""
    loop, _ = one_sequence_loop(demo_dir, redis_url, "prefill14@test")
    runtime, store, rid = loop.r, Lifecycle.connect(redis_url), "claimer-died"
    try:
        ticket = loop.intake.submit(admitted(store, rid))
        loop._iteration()
        assert ticket.done.is_set() and rid in runtime.pools.sequences
        assert store.take(rid, 0, "decode0@test", 0.2, handed_off=True) == Take.CLAIMED
        deadline = time.time() + 10
        while store.r.exists(key("lease", rid)) and time.time() < deadline:  # no beat: the claimer died
            loop._iteration()
        assert rid in runtime.pools.sequences  # its lease lapsed, not re-run yet: kept (the fence)
        assert store.rerun_orphan(rid, 60, 60) == 1
        loop._iteration()
    finally:
        loop.stop.set()
    assert rid not in runtime.pools.sequences


def test_a_handoff_decode_claimed_keeps_its_blocks_past_the_handoff_timeout(demo_dir, redis_url):
    """Decode claims a handoff as its message arrives and copies the state once its pools have room,
    which may come after DAYZERO_HANDOFF_TIMEOUT_S: prefill freed the blocks at the timeout, the next
    prompt was prefilled into them, and decode copied that request's state for the first one. The
    blocks now stay while decode holds the request; a handoff nobody claimed is freed at its timeout."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=1, handoff_timeout_s=0.2)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(Runtime.load(settings, "prefill13@test", "prefill", False), recording(sent))
    runtime, store, tickets = loop.r, Lifecycle.connect(redis_url), []
    try:
        tickets.append(loop.intake.submit(admitted(store, "claimed")))
        loop._iteration()
        assert store.take("claimed", 0, "decode0@test", 30, handed_off=True) == Take.CLAIMED  # waits for room
        time.sleep(0.3)  # past the handoff's timeout
        tickets.append(loop.intake.submit(admitted(store, "behind")))
        loop._iteration()
        assert set(runtime.pools.sequences) == {"claimed"} and not tickets[1].done.is_set()
        store.take_handoffs([("claimed", 0, sent[0].state.holder)], "decode0@test", 5)  # decode has copied it
        loop._iteration()
        assert tickets[1].done.is_set() and set(runtime.pools.sequences) == {"behind"}
        time.sleep(0.3)  # nobody claims this one: its handoff lapses (the reaper re-runs it)
        tickets.append(loop.intake.submit(admitted(store, "last")))
        loop._iteration()
    finally:
        loop.stop.set()
    assert tickets[2].done.is_set() and set(runtime.pools.sequences) == {"last"}
    assert [job.request.request_id for job in sent] == ["claimed", "behind", "last"]


def test_a_request_waiting_for_blocks_waits_without_spinning(demo_dir, redis_url):
    """Pools full of a handoff decode has not taken yet: the next request waits for the intake (or
    a reclaim) a few times a second, not in a busy loop, and runs once decode takes it. One that a
    client cancels meanwhile ends without blocks."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill7@test")
    store, tries = Lifecycle.connect(redis_url), []
    real_reserve = loop.r.ranks.reserve
    loop.r.ranks.reserve = lambda rid, *args: tries.append(rid) or real_reserve(rid, *args)
    tickets = [loop.intake.submit(admitted(store, rid)) for rid in ("holds", "waits", "leaves")]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert tickets[0].done.wait(30)  # (under load the first prefill may take a while)
        before = tries.count("waits")
        time.sleep(1.0)
        assert not tickets[1].done.is_set()  # "waits" finds no blocks
        assert tries.count("waits") - before <= 25  # a try every ~50 ms, not thousands
        store.cancel("leaves")
        assert tickets[2].done.wait(2) and store.done("leaves") == "cancelled"
        store.take_handoffs([("holds", 0, sent[0].state.holder)], "decode0@test", 5)
        assert tickets[1].done.wait(5)
    finally:
        loop.stop.set()
        thread.join(5)
    assert [job.request.request_id for job in sent] == ["holds", "waits"]


def test_a_prompt_the_pools_can_never_hold_fails_at_once_and_the_log_says_so(demo_dir, redis_url, caplog):
    """A worker started with a budget smaller than the context the gateway admits: the request ends
    with the reason, and the worker's log names it (it ended without a line)."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill16@test")
    store, too_long = Lifecycle.connect(redis_url), loop.r.pools.capacity_tokens() + 1
    run_jobs(loop, [admitted(store, "huge", tuple(i % 90 for i in range(too_long)))], 30)
    assert store.done("huge") == "error" and not sent and loop.r.pools.sequences == {}
    assert f"request huge: {too_long} tokens exceed the attention-state capacity" in caplog.text


def test_waiting_prompts_are_admitted_first_come_first_served_none_passing_one_that_does_not_fit(demo_dir, redis_url):
    """Another request's blocks leave 3 CSA blocks of 64 tokens: "large" (300 tokens, admitted first,
    arriving last: a re-run) waits for more. "small" (5 tokens) fitted and ran past it, and a steady
    stream of small ones could pass it for ever. Now it waits behind it; once blocks are free, both
    run, "large" first."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, handoff_timeout_s=600)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(Runtime.load(settings, "prefill17@test", "prefill", False), recording(sent))
    pools, store, now = loop.r.pools, Lifecycle.connect(redis_url), time.time()
    loop.r.ranks.reserve("elsewhere", pools.capacity_tokens() - 3 * 64)
    assert pools.fits(5) and not pools.fits(300)
    jobs = []
    for rid, length, created in (("small", 5, now), ("large", 300, now - 1)):
        prompt = tuple(i % 90 for i in range(length))
        request = GenerationRequest(
            request_id=rid, prompt_ids=prompt, sampling=SamplingParams(max_tokens=4), created=created
        )
        store.admit(request, [], "", 60)
        jobs.append(PrefillJob(request=request))
    tickets = [loop.intake.submit(job) for job in jobs]
    try:
        loop._iteration()
        assert not any(t.done.is_set() for t in tickets) and set(pools.sequences) == {"elsewhere"}
        assert [t.job.request.request_id for t in loop.pending] == ["large", "small"]  # in the order of admission
        loop.r.ranks.release("elsewhere")
        loop._iteration()
    finally:
        loop.stop.set()
    assert all(t.done.is_set() for t in tickets) and [job.request.request_id for job in sent] == ["large", "small"]
