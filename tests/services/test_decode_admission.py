"""Decode's admission of handed-off requests against a real Redis: a step's arrivals take one round
trip (their handoffs, each checked against its run), and the takes read the cancel marks, so a
request cancelled meanwhile ends before a step and without a read of its own."""

from __future__ import annotations

import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.decode_admission import admit
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import run_jobs
from .prefill_jobs import handed_off, needing


def test_taking_handoffs_says_which_were_cancelled_and_which_runs_are_over(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.cancel("gone")
    store.r.set(key("lease", "kept"), "handoff")  # decode imported it without a claim: still the handoff's
    for rid in ("rerun", "held"):  # a re-run since (attempt 1), one someone else holds
        store.r.set(key("handoff", rid), "decode:1")
    store.r.set(key("attempt", "rerun"), 1)
    store.r.set(key("lease", "held"), "decode9")
    handoffs = [("kept", 0, ""), ("gone", 0, "prefill0"), ("rerun", 0, "prefill0"), ("held", 0, "prefill0")]
    taken = store.take_handoffs(handoffs, "decode0", 30)
    assert taken == {"kept": Take.CLAIMED, "gone": Take.CANCELLED, "rerun": Take.STALE, "held": Take.STALE}
    assert store.owner("gone") == store.owner("kept") == "decode0"
    assert store.r.lrange(key("taken", "prefill0"), 0, -1) == [b"gone 0"]  # only a current run's holder is told
    assert store.owner("rerun") is None and store.owner("held") == "decode9"  # nothing written for them
    assert store.r.exists(key("handoff", "rerun"), key("handoff", "held")) == 2
    assert store.take_handoffs([], "decode0", 30) == {}
    store.take_handoffs([("x", 0, "prefill1"), ("y", 0, "prefill1")], "decode0", 30)
    assert store.r.lrange(key("taken", "prefill1"), 0, -1) == [b"x 0", b"y 0"]  # one holder's, in order


def test_a_steps_arrivals_are_admitted_in_one_round_trip_older_runs_and_duplicates_dropped(demo_dir, redis_url):
    """Each delivery was claimed on arrival (a stale one is dropped there); the admission's one round
    trip takes the handoffs of those imported. Of two deliveries of one request, the older run's is
    dropped; a run that ends during the import (re-run: its lease lapsed in a stall) is freed."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("a", "b", "late", "old", "twice"))
    store.r.set(key("attempt", "old"), 1)  # re-run since: its delivery (attempt 0) is stale on arrival
    runtime = Runtime.load(settings, "decode4@test", "decode", False)
    loop, calls = DecodeLoop(runtime), []
    real_take, real_receive = runtime.store.take_handoffs, loop.receiver.receive
    runtime.store.take_handoffs = lambda handoffs, *a: calls.append(handoffs) or real_take(handoffs, *a)

    def receive(ref, pools, rid):
        real_receive(ref, pools, rid)
        if rid == "late":
            store.r.set(key("attempt", rid), 1)  # the reaper re-ran it while this worker stalled
            store.r.delete(key("lease", rid))

    loop.receiver.receive = receive
    jobs = {job.request.request_id: job for job in sent}
    order = [jobs["a"], jobs["b"], jobs["late"], jobs["old"], jobs["a"], jobs["twice"]]  # "a" delivered twice
    tickets = [loop.intake.submit(job) for job in order]
    store.r.set(key("attempt", "twice"), 1)  # "twice" re-run and delivered again to this worker
    tickets.append(loop.intake.submit(jobs["twice"].model_copy(update={"attempt": 1})))
    loop.waiting.extend(loop.intake.drain(0))
    admit(loop)
    assert [[(rid, attempt) for rid, attempt, _ in handoffs] for handoffs in calls] == [
        [("a", 0), ("b", 0), ("late", 0), ("twice", 1)]
    ]
    assert set(loop.active) == {"a", "b", "twice"} and set(runtime.pools.sequences) == {"a", "b", "twice"}
    assert [t.done.is_set() for t in tickets] == [False, False, True, True, True, True, False]
    assert store.owner("a") == store.owner("b") == store.owner("twice") == runtime.name
    assert store.owner("late") is None  # released: the reaper's re-run may claim it
    for rid in ("a", "b", "twice"):
        loop._finish(rid, "stop")
    runtime.close()


def test_a_request_cancelled_during_its_handoff_ends_before_a_step_without_a_cancel_read(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("stays", "leaves"))
    store.cancel("leaves")  # the client goes while the job waits on decode's queue
    runtime = Runtime.load(settings, "decode3@test", "decode", False)
    loop, stepped, read = DecodeLoop(runtime), [], []
    real_decode, real_cancelled = runtime.ranks.decode, runtime.store.cancelled
    runtime.ranks.decode = lambda ids, tokens: stepped.append(list(ids)) or real_decode(ids, tokens)
    runtime.store.cancelled = lambda rids: read.extend(rids) or real_cancelled(rids)
    run_jobs(loop, sorted(sent, key=lambda job: job.request.request_id))
    assert store.done("leaves") == "cancelled" and len(store.streamed_tokens("leaves")) == 1  # prefill's token
    assert store.done("stays") is not None and all("leaves" not in ids for ids in stepped)
    assert "leaves" not in read  # its mark came with the take
    assert runtime.pools.sequences == {}


def test_a_waiting_request_whose_cancel_came_with_a_step_s_tokens_ends_without_its_state_imported(demo_dir, redis_url):
    """A claimed request waited for blocks and its client left: the step's append read its mark. The
    admission after (blocks free) copied its state in all the same (a Redis handoff's bytes taken, a
    prefill's blocks read), set its sampling up, then the cancel pass freed it: now it ends cancelled
    after prefill's token, nothing imported."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("waited",))
    runtime = Runtime.load(settings, "decode8@test", "decode", False)
    loop, imported = DecodeLoop(runtime), []
    real_receive = loop.receiver.receive
    loop.receiver.receive = lambda ref, pools, rid: imported.append(rid) or real_receive(ref, pools, rid)
    ticket = loop.intake.submit(sent[0])
    loop.waiting.extend(loop.intake.drain(0))
    store.cancel("waited")
    loop._append()  # a step's round trip: its tokens (none here), the marks of those active and waiting
    admit(loop)
    loop._cancel()
    assert imported == [] and runtime.pools.sequences == {} and loop.active == {} and ticket.done.is_set()
    assert store.done("waited") == "cancelled" and store.stream("waited") == ([sent[0].generated[0]], "cancelled")
    assert not store.r.exists(key("kvstate", "waited"))
    runtime.close()


def test_a_request_cancelled_while_its_first_step_runs_gets_no_token_of_it(demo_dir, redis_url):
    """Decode took the handoff before the client left, and the cancel came while the step ran (a
    worker SIGSTOPped there wrote the step's token, on SIGCONT, into the stream of a request
    cancelled seconds before): nothing of the step is written, the stream ends cancelled after
    prefill's token, the blocks are free; the other request of the batch goes on."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("goes_on", "left"))
    runtime = Runtime.load(settings, "decode6@test", "decode", False)
    loop, real_decode = DecodeLoop(runtime), runtime.ranks.decode

    def decode(ids, tokens):
        if "left" in ids and not store.cancelled(["left"]):
            store.cancel("left")  # the client leaves during the step
        return real_decode(ids, tokens)

    runtime.ranks.decode = decode
    run_jobs(loop, sent)
    first = next(job.generated[0] for job in sent if job.request.request_id == "left")
    assert store.done("left") == "cancelled" and store.stream("left") == ([first], "cancelled")
    assert [entry for entry, _ in store.r.xrange(key("tokens", "left"))] == [b"1-0", b"2-0"]  # the end at index 1
    assert store.done("goes_on") == "length" and len(store.streamed_tokens("goes_on")) == 3
    assert runtime.pools.sequences == {}
    runtime.close()


def test_a_handoff_decode_received_is_leased_to_it_and_re_run_when_it_dies(demo_dir, redis_url):
    """Decode claims a handed-off request as its message arrives, before the loop admits it: the
    request is leased to the worker (its heartbeat) while it waits for room, and the handoff stays
    till the state is imported. When the worker dies, the lease lapses and the reaper re-runs the
    request within seconds; the handoff's lease would have held it for handoff_timeout_s (60 s)."""
    from dayzero.serving.reaper import sweep

    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.3)
    store, sent = handed_off(settings, ("handed",))
    assert store.owner("handed") == "handoff"
    runtime = Runtime.load(settings, "decode5@test", "decode", False)
    loop = DecodeLoop(runtime)
    ticket = loop.intake.submit(sent[0])
    assert store.owner("handed") == runtime.name and store.r.exists(key("handoff", "handed"))
    time.sleep(1.0)  # over three leases, the loop not running: it waits in the intake
    assert not ticket.done.is_set() and store.owner("handed") == runtime.name
    loop.stop.set()  # the worker dies: no more heartbeats
    time.sleep(0.5)
    reruns = []
    assert "handed" in sweep(store, lambda job, stage: reruns.append(job), 60, 1, 60)
    assert [(job.attempt, len(job.generated)) for job in reruns if job.request.request_id == "handed"] == [(1, 1)]
    runtime.close()


def test_a_handoff_from_pools_of_another_layout_fails_its_request_at_once_naming_the_settings(demo_dir, redis_url):
    """Prefill and decode started with different DAYZERO_BLOCK_SIZE: the request was re-run on every
    worker, then failed after ~22 s with a message naming no setting."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("blocks",))
    decode = Runtime.load(settings.model_copy(update={"block_size": 32}), "decode5@test", "decode", False)
    run_jobs(DecodeLoop(decode), sent, timeout_s=30)
    assert store.stream("blocks")[1] == "error" and store.done("blocks") == "error"  # (after prefill's token)
    ending = store.r.xrevrange(key("tokens", "blocks"), count=1)[0][1]
    assert b"need the same checkpoint, DAYZERO_BLOCK_SIZE, DAYZERO_DTYPE" in b" ".join(ending.values())


def test_a_handoff_the_pools_can_never_hold_fails_at_once_and_the_log_says_so(demo_dir, redis_url, caplog):
    """A decode worker whose pools hold less than the request may grow to: it ends with the reason
    and the log names it (it ended without a line)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("large",))
    decode = Runtime.load(
        settings.model_copy(update={"kv_budget_mb": 1, "max_batch": 1}), "decode6@test", "decode", False
    )
    job = sent[0].model_copy(
        update={
            "request": sent[0].request.model_copy(
                update={"sampling": SamplingParams(max_tokens=decode.pools.capacity_tokens())}
            )
        }
    )
    run_jobs(DecodeLoop(decode), [job], timeout_s=30)
    assert store.done("large") == "error"
    total = 3 + decode.pools.capacity_tokens()
    assert f"request large: {total} tokens exceed the decode pools" in caplog.text


def test_waiting_requests_are_admitted_first_come_first_served_none_passing_one_that_does_not_fit(demo_dir, redis_url):
    """1 MB of pools with room for 4 sequences: 145 CSA blocks of 64 tokens (the budget's split). "holds"
    takes 94 of them; "large" (admitted first, arriving last: a re-run, or handed back by a peer) needs
    63 and waits. "small" (1 block) fitted and was admitted past it: a steady stream of small ones
    could pass it for ever. Now it waits behind it; when "holds" ends, both are admitted."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", kv_budget_mb=1, max_batch=4)
    store, sent = handed_off(settings, ("fcfs-holds", "fcfs-small", "fcfs-large"))
    jobs, now = {job.request.request_id.removeprefix("fcfs-"): job for job in sent}, time.time()
    runtime = Runtime.load(settings, "decode7@test", "decode", False)
    assert runtime.pools.allocators["compressed_csa"].total == 145
    loop = DecodeLoop(runtime)
    loop.intake.submit(needing(jobs["holds"], 6000, now - 2))  # 3 + 6000 tokens: 94 blocks
    loop.waiting.extend(loop.intake.drain(0))
    admit(loop)
    for job in (needing(jobs["small"], 3, now), needing(jobs["large"], 4000, now - 1)):  # 1 block, 63
        loop.intake.submit(job)
    loop.waiting.extend(loop.intake.drain(0))
    admit(loop)
    assert set(loop.active) == {"fcfs-holds"}
    assert [t.job.request.request_id for t in loop.waiting] == ["fcfs-large", "fcfs-small"]  # in admission order
    loop._finish("fcfs-holds", "stop")
    admit(loop)
    assert set(loop.active) == {"fcfs-large", "fcfs-small"} and loop.waiting == []
    for rid in ("fcfs-large", "fcfs-small"):
        loop._finish(rid, "stop")
    loop.stop.set()  # (its heartbeat thread)
    runtime.close()
