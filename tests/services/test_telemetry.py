"""One trace per request across the real services (console exporter, a JSON file per process)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.records import Token

from .conftest import MODEL, data_url, sse_events, start_stack


@pytest.fixture(scope="module")
def traced(demo_dir, tmp_path_factory):
    spans = tmp_path_factory.mktemp("spans")
    stack = start_stack(
        demo_dir,
        tmp_path_factory.mktemp("logs"),
        {"vision": 1, "prefill": 1, "decode": 1},
        {"DAYZERO_TRACE_EXPORTER": "console", "DAYZERO_TRACE_FILE": str(spans)},
    )
    yield stack, spans
    stack.stop()


def _spans(folder) -> list[dict]:
    out = []
    for file in folder.glob("*.jsonl"):
        out += [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    return out


def test_image_request_is_one_trace_with_stage_spans_in_order(traced):
    stack, folder = traced
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": data_url(40, 40, 3)}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    names = (
        "gateway.request",
        "vision.preprocess",
        "vision.encode",
        "prefill.forward",
        "kv.export",
        "decode.admit",
        "kv.import",
        "decode.generate",
    )
    deadline, found = time.time() + 30, {}
    while time.time() < deadline and len(found) < len(names):
        root = next(
            (
                s
                for s in _spans(folder)
                if s["name"] == "gateway.request" and s["attributes"].get("dayzero.request_id") == rid
            ),
            None,
        )
        if root:
            trace_id = root["context"]["trace_id"]
            found = {
                s["name"]: s for s in _spans(folder) if s["context"]["trace_id"] == trace_id and s["name"] in names
            }
        time.sleep(0.2)
    assert set(found) == set(names), sorted(found)
    span_id = {name: s["context"]["span_id"] for name, s in found.items()}
    parent = {name: s["parent_id"] for name, s in found.items()}
    for child, expected in (
        ("vision.preprocess", "gateway.request"),
        ("vision.encode", "gateway.request"),
        ("prefill.forward", "gateway.request"),
        ("kv.export", "prefill.forward"),
        ("decode.admit", "gateway.request"),
        ("kv.import", "decode.admit"),
        ("decode.generate", "gateway.request"),
    ):
        assert parent[child] == span_id[expected], f"{child} should be a child of {expected}"
    generate = found["decode.generate"]
    assert [e["name"] for e in generate["events"]] == ["first_token", "finish"]
    assert [e["name"] for e in found["gateway.request"]["events"]] == ["queued", "first_token"]  # (not streamed)
    assert {s["status"]["status_code"] for s in found.values()} == {"UNSET"}
    assert generate["attributes"]["dayzero.completion_tokens"] == 4
    gateway = found["gateway.request"]["attributes"]
    assert gateway["dayzero.model"] == MODEL
    assert gateway["dayzero.completion_tokens"] == r.json()["usage"]["completion_tokens"] == 4
    assert found["prefill.forward"]["attributes"]["dayzero.images"] == 1
    services = {s["resource"]["attributes"]["service.name"] for s in found.values()}
    assert services == {"dayzero-gateway", "dayzero-vision", "dayzero-prefill", "dayzero-decode"}


def test_text_request_takes_no_vision_span(traced):
    stack, folder = traced
    r = httpx.post(
        f"{stack.url}/v1/completions", json={"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 2}, timeout=60
    )
    rid = r.headers["x-request-id"]
    time.sleep(1)
    root = next(
        s for s in _spans(folder) if s["attributes"].get("dayzero.request_id") == rid and s["name"] == "gateway.request"
    )
    names = {s["name"] for s in _spans(folder) if s["context"]["trace_id"] == root["context"]["trace_id"]}
    assert "prefill.forward" in names and not any(n.startswith("vision.") for n in names)


def test_a_request_marks_its_hops(traced):
    """What bench/overhead.py reads: the gateway's admission and first read, the task's start on
    the prefill worker (its message carries the trace) and its claim, the forward's end, the first
    token's append."""
    stack, folder = traced
    body = {"model": MODEL, "prompt": [0, 7, 8, 9], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as r:
        rid = r.headers["x-request-id"]
        r.read()

    def spans_of_trace() -> dict[str, dict]:
        spans = _spans(folder)
        root = next((s for s in spans if s["attributes"].get("dayzero.request_id") == rid), None)
        if root is None:
            return {}
        return {s["name"]: s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]}

    names = ("gateway.request", "run/dayzero.prefill", "prefill.forward")
    deadline, found = time.time() + 30, {}
    while time.time() < deadline and not all(n in found for n in names):
        found = spans_of_trace()
        time.sleep(0.2)
    assert all(n in found for n in names), sorted(found)
    gateway = found["gateway.request"]
    assert [e["name"] for e in gateway["events"]] == ["queued", "first_token"]
    assert found["run/dayzero.prefill"]["parent_id"] == gateway["context"]["span_id"]
    task, forward = found["run/dayzero.prefill"], found["prefill.forward"]
    [claimed] = [e for e in task["events"] if e["name"] == "claimed"]
    assert claimed["attributes"] == {"dayzero.take": "CLAIMED"}
    [forwarded] = [e for e in forward["events"] if e["name"] == "forward_ended"]
    appended = next(e for e in forward["events"] if e["name"] == "tokens_appended")
    # each mark is stamped no later than the other side can act on it: the hops are never negative
    assert gateway["events"][0]["timestamp"] <= task["start_time"]
    assert task["start_time"] <= claimed["timestamp"] <= forward["start_time"]
    assert forward["start_time"] <= forwarded["timestamp"] <= appended["timestamp"]
    assert appended["timestamp"] <= gateway["events"][1]["timestamp"]


def test_an_append_is_marked_when_it_is_sent(redis_url):
    """bench/overhead.py's "published" mark: a reader (the gateway) may have the entries before the
    append's call returns to its thread; stamped after the return, the gateway's read could come
    before it (its hop negative)."""
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = Lifecycle.connect(redis_url)
    script, reached = store._append, []

    def late_back(**kw):
        reached.append(time.time_ns())
        answer = script(**kw)
        time.sleep(0.05)  # (the thread gets the CPU back late; the entry is readable already)
        return answer

    store._append = late_back
    with provider.get_tracer("test").start_as_current_span("prefill.forward"):
        store.append([Token("marked", 0, 5, "x")], {"marked": 0}, "prefill0@test")
    [event] = exporter.get_finished_spans()[0].events
    assert event.name == "tokens_appended" and event.timestamp <= reached[0]  # was: 50 ms after


def test_a_streams_trace_does_not_grow_with_its_tokens(traced):
    """The gateway's instrumentation makes no span per ASGI message: a stream would otherwise
    export one per chunk, and its trace would grow with every token."""
    stack, folder = traced

    def spans_of(max_tokens: int) -> tuple[list[str], int]:
        """The span names of a stream's trace, and how many chunks it sent."""
        body = {"model": MODEL, "prompt": [0, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as r:
            rid = r.headers["x-request-id"]
            chunks = sum(line.startswith("data: {") for line in r.iter_lines())
        deadline, names = time.time() + 30, []
        while time.time() < deadline and "decode.generate" not in names:
            time.sleep(0.2)
            spans = _spans(folder)
            root = next((s for s in spans if s["attributes"].get("dayzero.request_id") == rid), None)
            names = [s["name"] for s in spans if root and s["context"]["trace_id"] == root["context"]["trace_id"]]
        return sorted(names), chunks

    (short, few), (long, many) = spans_of(2), spans_of(48)
    # more chunks, each an ASGI message (not one per token: a token inside a UTF-8 character sends
    # none, and a gateway that falls behind sends what has queued as one: 24 tokens were 5 chunks
    # at load 15); a span per message would show with the first one more
    assert many > few
    assert "decode.generate" in short and "POST /v1/completions" in short
    assert long == short


def test_a_rerun_request_stays_in_its_trace(traced):
    """A request its decode worker lost (its lease taken away, as when the worker stalls) is re-run
    by the reaper: the re-run's task, prefill and decode spans join the request's trace (without its
    context recorded with the request, each started a trace of its own)."""
    stack, folder = traced
    body = {"model": MODEL, "prompt": [0, 7, 9], "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as streaming:
        rid, events = streaming.headers["x-request-id"], sse_events(streaming)
        assert [next(events) for _ in range(3)]  # decode streams it
        redis.Redis.from_url(stack.redis_url).set(f"dz:lease:{rid}", "decode9@elsewhere", px=1500)
        assert [data for _, data in events][-1] == "[DONE]"  # re-run once the taken lease lapsed
    deadline, ours = time.time() + 30, []
    while time.time() < deadline and sum(s["name"] == "decode.generate" for s in ours) < 2:
        time.sleep(0.2)
        ours = [s for s in _spans(folder) if s["attributes"].get("dayzero.request_id") == rid]
    root = next(s for s in ours if s["name"] == "gateway.request")
    trace_id = root["context"]["trace_id"]
    assert {s["context"]["trace_id"] for s in ours} == {trace_id}
    forwards = sorted(
        (s for s in ours if s["name"] == "prefill.forward"), key=lambda s: s["attributes"]["dayzero.attempt"]
    )
    assert [s["attributes"]["dayzero.attempt"] for s in forwards] == [0, 1]
    assert [s["attributes"]["dayzero.prompt_tokens"] for s in forwards] == [3, 3]  # the prompt's, re-run or not
    assert (
        forwards[0]["attributes"]["dayzero.streamed_tokens"] == 0 < forwards[1]["attributes"]["dayzero.streamed_tokens"]
    )
    assert {s["parent_id"] for s in forwards} == {root["context"]["span_id"]}
    generates = [s for s in ours if s["name"] == "decode.generate"]
    assert sorted(e["name"] for s in generates for e in s["events"] if e["name"] != "first_token") == [
        "finish",
        "lease_lost",
    ]
    tasks = [s for s in _spans(folder) if s["context"]["trace_id"] == trace_id and s["name"] == "run/dayzero.prefill"]
    assert len(tasks) == 2


def test_a_failed_request_marks_its_gateway_span_failed(traced):
    """Its worker fails it mid-stream: the request's root span says so (status ERROR, the reason)."""
    stack, folder = traced
    store = Lifecycle.connect(stack.redis_url)
    body = {"model": MODEL, "prompt": [0, 7, 5], "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as streaming:
        rid, events = streaming.headers["x-request-id"], sse_events(streaming)
        assert [next(events) for _ in range(3)]  # decode streams it
        owner = store.r.get(f"dz:lease:{rid}").decode()
        assert store.settle(rid, 0, owner, "error", end_at=1000, message="decode failed: RuntimeError")
        assert "error" in [data for _, data in events][-2]
    deadline, root = time.time() + 30, None
    while time.time() < deadline and root is None:
        time.sleep(0.2)
        spans = _spans(folder)
        root = next(
            (s for s in spans if s["name"] == "gateway.request" and s["attributes"].get("dayzero.request_id") == rid),
            None,
        )
    assert root["status"] == {"status_code": "ERROR", "description": "decode failed: RuntimeError"}


def test_a_resumed_stream_reads_in_its_requests_trace(traced):
    """A client that left and came back: the read again is a span of the request's trace (under its
    gateway.request span), linked to the resume's own HTTP span (a trace of its own)."""
    stack, folder = traced
    body = {"model": MODEL, "prompt": [0, 8, 9], "max_tokens": 40, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as first:
        rid, token = first.headers["x-request-id"], first.headers["x-resume-token"]
        last = next(event_id for event_id, _ in sse_events(first) if event_id)
    headers = {"X-Resume-Token": token, "Last-Event-ID": last}
    with httpx.stream("GET", f"{stack.url}/v1/requests/{rid}/stream", headers=headers, timeout=60) as again:
        assert [data for _, data in sse_events(again)][-1] == "[DONE]"
    deadline, found = time.time() + 30, {}
    while time.time() < deadline and len(found) < 3:
        time.sleep(0.2)
        spans = _spans(folder)
        found = {s["name"]: s for s in spans if s["attributes"].get("dayzero.request_id") == rid}
        found |= {s["name"]: s for s in spans if s["name"] == "GET /v1/requests/{request_id}/stream"}
    root, resume = found["gateway.request"], found["gateway.resume"]
    assert resume["context"]["trace_id"] == root["context"]["trace_id"]
    assert resume["parent_id"] == root["context"]["span_id"] and resume["attributes"]["dayzero.finished"]
    read = found["GET /v1/requests/{request_id}/stream"]
    assert [link["context"]["span_id"] for link in resume["links"]] == [read["context"]["span_id"]]
