"""DAYZERO_TASK_TIME_LIMIT_S bounds a request's time from admission: decode ends one that runs past
it as a token limit would (finish reason "length", its text and usage kept) and lets the others
run: in the loops (a real Redis) and through a stack's HTTP API, streamed or not."""

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
