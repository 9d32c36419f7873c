"""DAYZERO_TASK_TIME_LIMIT_S through a stack's HTTP API: a request cut by it is answered with its
text (finish reason "length", streamed or not), and one handed to a frozen decode worker ends at it
as one generating would (the loops' cases: test_time_limit.py)."""

from __future__ import annotations

import signal

import httpx
import pytest

from .conftest import MODEL, USAGE, chat, sse_events, start_stack, stream_text


@pytest.fixture(scope="module")
def limited(text_dir, tmp_path_factory):
    """A stack whose requests may run 3 s, where a handoff nobody takes waits past that (its own
    bound and the no-worker one far off); every worker stops cleanly at the end (SIGTERM, no SIGKILL),
    one frozen and continued too."""
    limits = {"DAYZERO_TASK_TIME_LIMIT_S": "3", "DAYZERO_MAX_CONTEXT": "65536", "DAYZERO_MAX_TOKENS_LIMIT": "60000"}
    limits |= {"DAYZERO_NO_WORKER_TIMEOUT_S": "600", "DAYZERO_HANDOFF_TIMEOUT_S": "600"}  # (a lapsed handoff: re-run)
    stack = start_stack(text_dir, tmp_path_factory.mktemp("logs"), {"vision": 0, "prefill": 1, "decode": 1}, limits)
    yield stack
    assert stack.stop() == []


def test_the_api_answers_a_request_cut_by_the_time_limit_with_its_text(limited):
    stack = limited
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


def test_a_request_handed_to_a_frozen_decode_worker_ends_at_the_time_limit(limited):
    """Decode's only worker SIGSTOPped, DAYZERO_NO_WORKER_TIMEOUT_S far off: prefill streams the
    first token and hands off to nobody (or to the frozen worker's pending pop: re-run, a second
    token). The request waited for its handoff to lapse (DAYZERO_HANDOFF_TIMEOUT_S: re-run, and ended
    by prefill's limit) or the no-worker bound (an error), not the time limit; now it ends at the
    limit as one generating would: "length", its text and usage kept, streamed or not."""
    stack = limited
    decode_worker = stack.child("decode0").proc
    try:
        decode_worker.send_signal(signal.SIGSTOP)
        body = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 60, "ignore_eos": True, "temperature": 0}
        answer = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)  # (no byte before its answer)
        assert answer.status_code == 200, answer.text  # (its text: what its tokens released, maybe none yet)
        choice, usage = answer.json()["choices"][0], answer.json()["usage"]
        assert choice["finish_reason"] == "length" and 1 <= usage["completion_tokens"] < 60
        _, _, final, usage = stream_text(f"{stack.url}/v1/completions", {**body, **USAGE}, timeout=60)
        assert final["choices"][0]["finish_reason"] == "length"
        assert 1 <= usage["completion_tokens"] < 60 and usage["prompt_tokens"] == 4
    finally:
        decode_worker.send_signal(signal.SIGCONT)
