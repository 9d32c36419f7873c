"""DAYZERO_TASK_TIME_LIMIT_S bounds a request's time from admission: decode ends one that runs past
it as a token limit would (finish reason "length", its text and usage kept) and lets the others
run: in the loops (a real Redis; through a stack's HTTP API: test_time_limit_stack.py). A request waiting
for a worker's room past it ends too (waiting.py), and so does one waiting in a stage's queue or as a
handoff no decode worker takes (the gateway's reaper)."""

from __future__ import annotations

import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.decode_admission import admit
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.reaper import OverdueWaits
from dayzero.serving.records import Token, decode
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted, one_sequence_loop


def test_a_request_past_the_time_limit_ends_at_length_and_the_others_go_on(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", task_time_limit_s=2)
    store, sent = Lifecycle.connect(settings.redis_url), []
    # loaded first: the 2 s limit counts from the requests' admission (loads under load took longer)
    prefill = PrefillLoop(Runtime.load(settings, "prefill-limit@test", "prefill", False), recording(sent))
    runtime = Runtime.load(settings, "decode-limit@test", "decode", False)
    long = SamplingParams(max_tokens=2000, ignore_eos=True)
    requests = [
        GenerationRequest(request_id="overdue", prompt_ids=(0, 5, 6), sampling=long, created=time.time()),
        GenerationRequest(
            request_id="short", prompt_ids=(0, 5, 7), sampling=SamplingParams(max_tokens=3), created=time.time()
        ),
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    run_jobs(prefill, [PrefillJob(request=r) for r in requests])
    started = time.time()
    run_jobs(DecodeLoop(runtime), sent, timeout_s=60)
    assert store.done("short") == "length" and store.done("overdue") == "length"
    entries = store.r.xrange(key("tokens", "overdue"))
    last = decode("overdue", entries[-1][1])
    assert (last.token, last.finish_reason, last.error) == (-1, "length", "")  # an ending after the last token
    assert last.usage == {"prompt_tokens": 3, "completion_tokens": last.index} and len(entries) == last.index + 1
    assert 1 < last.index < 2000 and time.time() - started < 30
    runtime.close()


def _last(store: Lifecycle, rid: str):
    """The last entry of ``rid``'s stream, decoded."""
    return decode(rid, store.r.xrevrange(key("tokens", rid), count=1)[0][1])


def test_a_request_waiting_in_decode_for_blocks_past_the_time_limit_ends_at_length_with_its_first_token(
    demo_dir, redis_url
):
    """Claimed, it waited for blocks (behind a long generation) with no end: only the requests in
    the batch were looked at. It ends as they do: "length", prefill's token kept and counted. One
    within the limit waits on. Pools of 145 CSA blocks of 64 tokens: "holds" takes 94, each other 63."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", kv_budget_mb=1, max_batch=4)
    store, sent, now = Lifecycle.connect(settings.redis_url), [], time.time()
    requests = [
        GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=n), created=at)
        for rid, n, at in (("holds", 6000, now), ("waited", 4000, now - 100), ("in-time", 4000, now))
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    prefill = PrefillLoop(Runtime.load(settings, "prefill-waited@test", "prefill", False), recording(sent))
    run_jobs(prefill, [PrefillJob(request=r) for r in requests])  # (prefill's limit: the default hour)
    limited = settings.model_copy(update={"task_time_limit_s": 60})
    runtime = Runtime.load(limited, "decode-waited@test", "decode", False)
    loop, jobs = DecodeLoop(runtime), {job.request.request_id: job for job in sent}
    for batch in (["holds"], ["waited", "in-time"]):
        tickets = [loop.intake.submit(jobs[rid]) for rid in batch]
        loop.waiting.extend(loop.intake.drain(0))
        admit(loop)
    assert set(loop.active) == {"holds"} and len(loop.waiting) == 2
    loop._end_overdue()
    assert store.done("waited") == "length" and tickets[0].done.is_set()
    last = _last(store, "waited")
    assert (last.index, last.token, last.finish_reason, last.error) == (1, -1, "length", "")  # after prefill's token
    assert last.usage == {"prompt_tokens": 3, "completion_tokens": 1}
    assert [t.job.request.request_id for t in loop.waiting] == ["in-time"] and store.done("in-time") is None
    assert set(loop.active) == {"holds"} and store.done("holds") is None
    loop._finish("holds", "stop")
    loop.stop.set()  # (its heartbeat thread)
    runtime.close()


def test_a_prompt_waiting_in_prefill_for_blocks_past_the_time_limit_ends_with_overloaded_or_its_text(
    demo_dir, redis_url
):
    """Pools of one sequence, held by a handoff decode has not taken: a prompt past the limit that
    streamed nothing ends with the 503 code ``overloaded`` (it never ran: a "length" would say it
    had), a re-run's with "length" and the tokens it streamed before; one within the limit waits on."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill-waited@test")
    store, now, limit_s = Lifecycle.connect(redis_url), time.time(), loop.r.settings.task_time_limit_s
    jobs = []
    for rid, created, generated in (
        ("p-holds", now, ()),
        ("p-late", now - limit_s - 1, ()),
        ("p-rerun", 0.0, (7,)),
        ("p-in-time", now, ()),
    ):
        request = GenerationRequest(
            request_id=rid, prompt_ids=(0, 5, 6, 7, 8), sampling=SamplingParams(max_tokens=4), created=created
        )
        store.admit(request, [], "", 60)
        jobs.append(PrefillJob(request=request, generated=generated, attempt=len(generated)))
    store.r.set(key("attempt", "p-rerun"), 1)  # re-run after a worker failure, its token streamed
    store.append([Token("p-rerun", 0, 7, "a")], {"p-rerun": 1}, "")
    try:
        holds = loop.intake.submit(jobs[0])
        loop._iteration()
        assert holds.done.is_set() and not loop.r.pools.fits(5)  # handed off, its blocks kept for decode
        waiting = [loop.intake.submit(job) for job in jobs[1:]]
        loop._iteration()
    finally:
        loop.stop.set()
    assert [t.done.is_set() for t in waiting] == [True, True, False]
    late, rerun = _last(store, "p-late"), _last(store, "p-rerun")
    assert (store.done("p-late"), late.index, late.code) == ("error", 0, "overloaded")
    assert f"DAYZERO_TASK_TIME_LIMIT_S={limit_s}" in late.error
    assert (store.done("p-rerun"), rerun.index, rerun.finish_reason) == ("length", 1, "length")
    assert rerun.usage == {"prompt_tokens": 5, "completion_tokens": 1}
    assert [t.job.request.request_id for t in loop.pending] == ["p-in-time"] and len(sent) == 1


def test_a_prompt_retried_past_the_time_limit_after_its_tokens_answer_was_lost_ends_after_that_token(
    demo_dir, redis_url
):
    """Redis wrote prefill's token but its answer never came (a reply past the client's socket
    timeout): the loop puts the request back with the tokens it came with and, past the limit, ends
    it. The end goes after the token its client got, counted in its usage: counting only the job's
    own tokens ended it with 503 ``overloaded`` after that token's text (SETTLE moved the end after
    the token). (A re-run's prefill appends no token: decode feeds the last one it streamed.)"""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, task_time_limit_s=1)
    runtime = Runtime.load(settings, "prefill-lost@test", "prefill", False)
    loop, store, rid = PrefillLoop(runtime, recording([])), runtime.store, "lost"
    job = admitted(store, rid)
    real_append, lost = store.append, [True]

    def answer_lost_once(tokens, *args):
        appended = real_append(tokens, *args)
        if lost and lost.pop():
            time.sleep(1.2)  # past the time limit by the retry
            raise redis.TimeoutError("Timeout reading from socket")  # written, its answer lost
        return appended

    store.append = answer_lost_once
    run_jobs(loop, [job], 30)
    tokens, _ = store.stream(rid)
    last = _last(store, rid)
    assert len(tokens) == 1 and store.done(rid) == "length"
    assert (last.index, last.token, last.finish_reason, last.error) == (len(tokens), -1, "length", "")
    assert last.usage == {"prompt_tokens": 5, "completion_tokens": len(tokens)}
    runtime.close()


def test_requests_waiting_in_a_queue_or_a_handoff_past_the_time_limit_end_once_and_free_what_they_hold(
    demo_dir, redis_url
):
    """No worker claims them, so no worker's limit ended them: a handoff no decode worker took
    waited (its prefill blocks kept) until DAYZERO_NO_WORKER_TIMEOUT_S, or for ever while a decode
    worker crash-looped. The reaper ends each: the handoff and a queued re-run with "length" and the
    tokens they streamed, a queued first run with 503 ``overloaded``, a cancelled one as cancelled;
    one within the limit waits on. Once: a late claim is stale, and a second pass ends nothing."""
    loop, sent = one_sequence_loop(demo_dir, redis_url, "prefill-queued@test")
    store, past = Lifecycle.connect(redis_url), time.time() - 100
    prompt, params = (0, 5, 6, 7, 8), SamplingParams(max_tokens=4)
    for rid, created in (("q-handoff", past), ("q-first", past), ("q-rerun", past), ("q-left", past), ("q-new", 0)):
        request = GenerationRequest(request_id=rid, prompt_ids=prompt, sampling=params, created=created or time.time())
        store.admit(request, [], "", 60)
        if rid != "q-handoff":
            store.enqueue(rid, "prefill", rid, 60)  # its message waits on prefill's queue
    store.r.set(key("attempt", "q-rerun"), 1)  # re-run after a worker failure, its token streamed
    store.append([Token("q-rerun", 0, 7, "a")], {"q-rerun": 1}, "")
    store.cancel("q-left")
    run_jobs(loop, [PrefillJob(request=store.request("q-handoff"))])  # (the loop's limit: the default hour)
    assert store.owner("q-handoff") == HANDOFF_OWNER and not loop.r.pools.fits(5)  # its blocks kept for decode
    ended = OverdueWaits(store, 50, loop.r.codec).end()
    assert {"q-handoff", "q-first", "q-rerun", "q-left"} <= set(ended) and "q-new" not in ended
    handoff, first, rerun = _last(store, "q-handoff"), _last(store, "q-first"), _last(store, "q-rerun")
    assert (store.done("q-handoff"), handoff.index, handoff.token, handoff.error) == ("length", 1, -1, "")
    assert handoff.usage == {"prompt_tokens": 5, "completion_tokens": 1} == rerun.usage
    assert (store.done("q-rerun"), rerun.index) == ("length", 1)
    assert (store.done("q-first"), first.index, first.code) == ("error", 0, "overloaded")
    assert "DAYZERO_TASK_TIME_LIMIT_S=50" in first.error and store.done("q-left") == "cancelled"
    assert store.done("q-new") is None and "q-new" in store.active()
    assert all(store.r.ttl(key("tokens", rid)) > 0 for rid in ("q-handoff", "q-first", "q-rerun", "q-left"))
    assert OverdueWaits(store, 50, loop.r.codec).end() == []  # ended once
    assert store.take_handoffs([(j.request.request_id, j.attempt, j.state.holder) for j in sent], "decode0", 30) == {
        "q-handoff": Take.STALE
    }
    assert loop.handed_off.reclaim() and loop.r.pools.fits(5)  # the handoff's blocks are free
    loop.r.close()


def test_a_request_past_the_time_limit_ends_with_the_text_it_held_back(demo_dir, redis_url, monkeypatch):
    """Forced onto 中's lead byte (token 170, 0xE4) with a stop string "\\ufffd!" that "\\ufffd" may
    begin: its text is held back (a cut character, then a stop string's start). Ended by the time
    limit, its stream's text is the ids' decode, as a token limit would leave it: the held "\\ufffd"
    was dropped ("" streamed, then an ending without text)."""
    import dayzero.serving.decode_loop as decode_loop

    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    sampling = SamplingParams(max_tokens=50, ignore_eos=True, logit_bias=((170, 100.0),), stop=("\ufffd!",))
    request = GenerationRequest(request_id="held", prompt_ids=(0, 5, 6), sampling=sampling, created=time.time())
    store, sent = Lifecycle.connect(settings.redis_url), []
    store.admit(request, [], "", 60)
    prefill = PrefillLoop(Runtime.load(settings, "prefill-held@test", "prefill", False), recording(sent))
    run_jobs(prefill, [PrefillJob(request=request)])
    runtime = Runtime.load(settings, "decode-held@test", "decode", False)
    loop = DecodeLoop(runtime)
    ticket = loop.intake.submit(sent[0])
    loop.waiting.extend(loop.intake.drain(0))
    admit(loop)
    loop._step()  # a second lead byte: the first is U+FFFD, held as a stop string's start
    monkeypatch.setattr(decode_loop, "overdue", lambda created, limit_s: True)
    loop._end_overdue()
    entries = [decode("held", fields) for _, fields in store.r.xrange(key("tokens", "held"))]
    ids = [t.token for t in entries if t.token >= 0]
    assert ids == [170, 170] and store.done("held") == "length" and ticket.done.is_set()
    assert "".join(t.text for t in entries) == runtime.codec.decode(ids) == "\ufffd\ufffd"
    loop.stop.set()  # (its heartbeat thread)
    runtime.close()


def test_a_request_waiting_past_the_time_limit_ends_with_the_character_it_held_back(codec):
    """One that streamed 中's lead byte (0xE4, its text "" held) and then waited (a queue, a peer's
    room, blocks) ends with that byte's U+FFFD, as a token limit would: its ending had no text."""
    from types import SimpleNamespace

    from dayzero.serving.time_limit import past_limit
    from dayzero.serving.waiting import end_overdue

    from ..test_tokenizer import _byte_token

    streamed = codec.encode("Hi", special=False) + [_byte_token(codec, 0xE4)]
    request = GenerationRequest(request_id="w", prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=9), created=0.0)
    assert past_limit(codec, request, streamed, 1.0).text == "\ufffd" == codec.decode(streamed)[2:]
    settled = []
    runtime = SimpleNamespace(
        settings=SimpleNamespace(task_time_limit_s=1.0),
        stats=SimpleNamespace(stage="decode"),
        codec=codec,
        store=SimpleNamespace(streamed_tokens=lambda rid: streamed),
    )
    tickets = [SimpleNamespace(job=SimpleNamespace(request=request))]
    end_overdue(tickets, runtime, lambda ticket, *args, **end: settled.append((args, end)))
    assert settled == [
        (
            ("length", ""),
            {"index": 3, "usage": {"prompt_tokens": 2, "completion_tokens": 3}, "code": "", "text": "\ufffd"},
        )
    ]
