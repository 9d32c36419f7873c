"""End to end through real HTTP, a real Redis and real worker processes (1 prefill, 2 decode)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis

from .conftest import (
    MODEL,
    USAGE,
    chat,
    prompt_ids,
    resumed_events,
    sse_events,
    start_stack,
    stream_text,
    wait_until,
)
from .served_equals import assert_concurrent_streams_equal_reference, assert_image_request_equals_in_process_run

# A resume must reach the gateway within the disconnect grace: the tests' 0.3 s elapsed first on a
# loaded 2-core machine. This bound is the test's (how long the client takes to come back), not the
# behaviour's: no test here waits out the grace.
LONG_GRACE = {"DAYZERO_DISCONNECT_GRACE_S": "60"}


@pytest.fixture(scope="module")
def stack(demo_dir, tmp_path_factory):
    s = start_stack(demo_dir, tmp_path_factory.mktemp("logs"), {"vision": 1, "prefill": 1, "decode": 2}, LONG_GRACE)
    yield s
    s.stop()


def test_completion_equals_in_process_engine(stack, reference):
    ids = prompt_ids(1)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["text"] == reference(ids, 24)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 24, "total_tokens": len(ids) + 24}


def test_chat_stream_and_body_agree(stack):
    body = chat("The quick brown fox", max_tokens=16, ignore_eos=True)
    whole = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60).json()
    text, ids, final, usage = stream_text(f"{stack.url}/v1/chat/completions", {**body, **USAGE})
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    assert text == whole["choices"][0]["message"]["content"]
    assert final["object"] == "chat.completion.chunk" and usage == whole["usage"]
    numbers = [int(i.split("-")[0]) for i in ids]
    assert numbers == sorted(set(numbers)) and numbers[-1] == 16  # ids are token indices + 1


def test_sixteen_concurrent_streams_on_two_decode_workers(stack, reference):
    assert_concurrent_streams_equal_reference(stack.url, reference, streams=16, base_tokens=12)

    workers = redis.Redis.from_url(stack.redis_url).hgetall("dz:workers:decode")
    assert len(workers) == 2


@pytest.mark.slow
def test_256_concurrent_streams_each_complete_or_get_429(stack):
    import asyncio

    async def one(client: httpx.AsyncClient, i: int) -> str:
        body = {"model": MODEL, "prompt": prompt_ids(i % 8), "max_tokens": 4, "ignore_eos": True, "stream": True}
        async with client.stream("POST", f"{stack.url}/v1/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines()]
        if r.status_code == 429:
            return "refused" if r.headers["retry-after"] and '"rate_limit_error"' in "".join(lines) else "?"
        data = [line for line in lines if line.startswith("data:")]
        if r.status_code != 200 or len(data) < 2:  # (say what came instead)
            return f"{r.status_code}: {lines[:4]}"
        final = json.loads(data[-2][5:])
        finished = "choices" in final and final["choices"][0]["finish_reason"]  # else an error event: say which
        return "completed" if data[-1] == "data: [DONE]" and finished else str(final)

    async def run() -> list[str]:  # bounded: keep-alives would hold a stuck stream open forever
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=300), timeout=300) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(256))), 240)

    outcomes = asyncio.run(run())
    assert set(outcomes) <= {"completed", "refused"}, [o for o in outcomes if o not in ("completed", "refused")]
    assert outcomes.count("completed") >= 16


def test_resume_with_last_event_id_gives_exactly_the_rest(stack):
    body = chat("resume me", max_tokens=20, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        events = [(i, d) for i, d in sse_events(r)]
    full = {i: d for i, d in events if i}
    ids = list(full)
    cut = ids[len(ids) // 2]
    url = f"{stack.url}/v1/requests/{rid}/stream"
    for stranger in ({}, {"X-Resume-Token": "guess"}):  # the id alone (it is in every log) reads nothing
        refused = httpx.get(url, headers={"Last-Event-ID": "0-0", **stranger}, timeout=10)
        assert refused.status_code == 404 and refused.json()["error"]["type"] == "invalid_request_error"
    with httpx.stream("GET", url, headers={"Last-Event-ID": cut, "X-Resume-Token": token}, timeout=60) as r:
        resumed = [(i, d) for i, d in sse_events(r) if d != "[DONE]"]
    # the whole stream is there at once: the gateway may send several tokens in one chunk
    rest = [full[i] for i in ids[ids.index(cut) + 1 :]]
    assert _content(d for _, d in resumed) == _content(rest) != ""
    assert resumed[-1][0] == ids[-1] and resumed[-1][1]["choices"][0]["finish_reason"] == "length"
    order = [_order(i) for i in [cut, *(i for i, _ in resumed)]]
    assert order == sorted(set(order))  # each after the one before


def test_a_request_answered_in_one_body_has_no_stream_to_read(stack):
    """Its client has the whole answer, and its id only with it (README: nobody can resume it): no
    resume token is handed out, and its stream's URL is a 404 (its token replayed the body in chunks)."""
    r = httpx.post(f"{stack.url}/v1/chat/completions", json=chat("one body", max_tokens=4), timeout=60)
    assert r.status_code == 200 and "x-resume-token" not in r.headers, r.headers
    url = f"{stack.url}/v1/requests/{r.headers['x-request-id']}/stream"
    for token in ({}, {"X-Resume-Token": "guess"}):
        refused = httpx.get(url, headers=token, timeout=10)
        assert refused.status_code == 404 and "answered in one body" in refused.json()["error"]["message"]


def test_a_stream_read_behind_sends_its_queued_tokens_as_one_chunk(stack):
    """Read back from the start once finished (a gateway lagging its decode worker at its worst):
    every token queued, so they go out as one chunk with all their logprobs, then the finish."""
    body = chat("all at once", max_tokens=20, ignore_eos=True, stream=True, logprobs=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        live = [d for i, d in sse_events(r) if i]
    url = f"{stack.url}/v1/requests/{rid}/stream"
    with httpx.stream("GET", url, headers={"Last-Event-ID": "0-0", "X-Resume-Token": token}, timeout=60) as r:
        again = [d for i, d in sse_events(r) if i]
    assert len(live) > 2 and len(again) == 2 and again[-1]["choices"][0]["finish_reason"] == "length"
    assert _content(again) == _content(live)
    logprobs = [len(d["choices"][0]["logprobs"]["content"]) for d in again]
    assert sum(logprobs) == 20 and logprobs[-1] == 1


def _content(chunks) -> str:
    return "".join(d["choices"][0]["delta"].get("content") or "" for d in chunks)


def _order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def test_resume_from_a_finished_streams_end_or_past_it_ends_at_once(stack):
    """A client that lost only the usage chunk or ``[DONE]`` reconnects with the final chunk's id:
    it gets what it missed, never keep-alives; an id Redis cannot take is this client's 400 alone."""
    body = chat("the end", max_tokens=6, ignore_eos=True, stream=True, **USAGE)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rid, token = r.headers["x-request-id"], r.headers["x-resume-token"]
        last = [i for i, _ in sse_events(r) if i][-1]
    url, deadline = f"{stack.url}/v1/requests/{rid}/stream", time.time() + 20
    for after in (last, "700-0"):
        data = []
        with httpx.stream("GET", url, headers={"Last-Event-ID": after, "X-Resume-Token": token}, timeout=60) as r:
            for line in r.iter_lines():  # keep-alives come each second: a hang ends at the deadline
                data += [line[5:].strip()] if line.startswith("data:") else []
                if data[-1:] == ["[DONE]"] or time.time() > deadline:
                    break
        assert len(data) == 2 and data[-1] == "[DONE]", data
        missed = json.loads(data[0])  # the usage chunk
        assert missed["choices"] == [] and missed["usage"]["completion_tokens"] == 6
    for bad in ("1-99999999999999999999", f"{2**64}-0"):
        refused = httpx.get(url, headers={"Last-Event-ID": bad, "X-Resume-Token": token}, timeout=10)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "Last-Event-ID"


def test_resume_in_flight_after_a_disconnect(stack):
    body = chat("keep going", max_tokens=400, ignore_eos=True, stream=True)
    seen, r = [], redis.Redis.from_url(stack.redis_url)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as response:
        rid, token = response.headers["x-request-id"], response.headers["x-resume-token"]
        for event_id, _ in sse_events(response):
            if event_id:
                seen.append(event_id)
            if len(seen) == 3:
                break  # the client drops the connection mid-stream ...
    # ... the gateway sees it go (nobody reads: its cancel waits out the grace) ...
    assert wait_until(lambda: not r.exists(f"dz:watchers:{rid}"), 60)
    rest = resumed_events(stack.url, rid, token, seen[-1])  # ... and it comes back within the grace
    assert rest[-1][1]["choices"][0]["finish_reason"] == "length", rest[-1]
    numbers = [int(i.split("-")[0]) for i in seen + [e for e, _ in rest]]
    assert numbers == sorted(set(numbers))  # no duplicates, in order


def test_stream_usage_follows_stream_options(stack):
    """As OpenAI: a usage chunk (no choices) before [DONE] only when include_usage asks for it."""
    body = chat("count", max_tokens=3, ignore_eos=True)
    assert stream_text(f"{stack.url}/v1/chat/completions", {**body, **USAGE})[3]["completion_tokens"] == 3
    for off in (body, {**body, "stream_options": {"include_usage": False}}, {**body, "stream_options": {}}):
        _, _, final, usage = stream_text(f"{stack.url}/v1/chat/completions", off)
        assert usage is None and "usage" not in final


def test_non_streamed_requests_record_time_to_first_token(stack):
    def count() -> float:
        text = httpx.get(f"{stack.url}/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("dayzero_time_to_first_token_seconds_count"))
        return float(line.split()[-1])

    before = count()
    body = chat("time me", max_tokens=3, ignore_eos=True)
    assert httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert count() == before + 1


def test_models_health_ready_metrics_and_openapi(stack):
    listed = httpx.get(f"{stack.url}/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [MODEL] and httpx.get(f"{stack.url}/v1/models/{MODEL}").json() == listed[0]
    missing = httpx.get(f"{stack.url}/v1/models/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{stack.url}/health").json() == {"status": "ok"}
    ready = lambda: httpx.get(f"{stack.url}/ready").json()  # noqa: E731
    assert wait_until(lambda: ready()["workers"]["decode"] == 2, 60)  # (the stack is ready once one is)
    assert ready()["ready"]
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert "dayzero_time_to_first_token_seconds_bucket" in metrics
    assert "/v1/chat/completions" in httpx.get(f"{stack.url}/openapi.json").json()["paths"]


def test_text_and_image_request_equals_in_process_multimodal_run(stack, demo_dir):
    assert_image_request_equals_in_process_run(stack.url, demo_dir)
