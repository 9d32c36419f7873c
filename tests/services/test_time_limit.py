"""DAYZERO_TASK_TIME_LIMIT_S bounds a request's time from admission: decode ends one that runs past
it as a token limit would (finish reason "length", its text and usage kept) and lets the others
run: in the loops (a real Redis) and through a stack's HTTP API, streamed or not. A request waiting
for a worker's room past it ends too (waiting.py)."""

from __future__ import annotations

import time

import httpx

from dayzero.params import SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.records import decode
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import chat, recording, run_jobs, sse_events, start_stack
from .prefill_jobs import one_sequence_loop


def test_a_request_past_the_time_limit_ends_at_length_and_the_others_go_on(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", task_time_limit_s=2)
    store, sent = Lifecycle.connect(settings.redis_url), []
    long = SamplingParams(max_tokens=2000, ignore_eos=True)
    requests = [
        GenerationRequest(request_id="overdue", prompt_ids=(0, 5, 6), sampling=long, created=time.time()),
        GenerationRequest(
            request_id="short", prompt_ids=(0, 5, 7), sampling=SamplingParams(max_tokens=3), created=time.time()
        ),
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    prefill = PrefillLoop(Runtime.load(settings, "prefill-limit@test", "prefill", False), recording(sent))
    run_jobs(prefill, [PrefillJob(request=r) for r in requests])
    runtime = Runtime.load(settings, "decode-limit@test", "decode", False)
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
        loop._admit()
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


def test_the_api_answers_a_request_cut_by_the_time_limit_with_its_text(text_dir, tmp_path):
    limits = {"DAYZERO_TASK_TIME_LIMIT_S": "2", "DAYZERO_MAX_CONTEXT": "65536", "DAYZERO_MAX_TOKENS_LIMIT": "60000"}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, limits)
    try:
        long = chat("go on", max_tokens=60000, ignore_eos=True, temperature=1)
        answer = httpx.post(f"{stack.url}/v1/chat/completions", json=long, timeout=120)
        assert answer.status_code == 200, answer.text  # not a 500 that OpenAI's clients retry
        choice, usage = answer.json()["choices"][0], answer.json()["usage"]
        assert choice["finish_reason"] == "length" and choice["message"]["content"]
        assert 0 < usage["completion_tokens"] < 60000
        streamed = {**long, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=streamed, timeout=120) as response:
            chunks = [data for _, data in sse_events(response)]
        assert chunks.pop() == "[DONE]"
        assert all("error" not in chunk for chunk in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert 0 < chunks[-1]["usage"]["completion_tokens"] < 60000
    finally:
        assert stack.stop() == []
