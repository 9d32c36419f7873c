"""One scrape of the gateway shows every documented metric, from the gateway and the workers."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics import GatewayMetrics

from .conftest import MODEL, USAGE, chat, data_url, sse_events

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


SPECULATIVE = "dayzero_spec_decode_"  # only a speculating decode worker has these


def _documented() -> dict[str, str]:
    """Name -> type of each metric docs/metrics.md lists."""
    return dict(re.findall(r"^\| `(dayzero_[a-z0-9_]+)` \| (\w+) \|", DOCS.read_text(), flags=re.MULTILINE))


def test_documented_names_are_scraped_from_a_running_stack(stack):
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(30, 30, 9)}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3, "ignore_eos": True}
    assert httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=60).status_code == 200  # (to decode)
    httpx.post(f"{stack.url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)  # a 404
    time.sleep(1.0)  # a heartbeat publishes the workers' snapshots
    text = httpx.get(f"{stack.url}/metrics", timeout=30).text
    documented = _documented()
    names = [n for n in documented if not n.startswith(SPECULATIVE)]  # see test_speculative_decode
    assert len(names) >= 25
    missing = [n for n in names if not re.search(rf"^{n}(_bucket|_count|_sum|_total)?[{{ ]", text, re.MULTILINE)]
    assert not missing, missing
    # the exposition parses; each family is documented with its type, and only counters end in _total
    families = {f.name: f.type for f in text_string_to_metric_families(text)}  # (no *_created: see below)
    exposed = {f"{name}_total" if kind == "counter" else name: kind for name, kind in families.items()}
    assert exposed == documented
    assert not [name for name, kind in families.items() if name.endswith("_total")]  # a gauge named as a counter
    for stage in ("vision", "prefill", "decode"):
        assert f'stage="{stage}"' in text
    assert re.search(r'dayzero_kv_blocks_capacity\{[^}]*pool="compressed_csa"[^}]*\} [1-9]', text)
    assert re.search(r"dayzero_encoder_cache_misses_total\{[^}]*\} [1-9]", text)
    running = re.findall(r"^dayzero_(?:batch_size|tokens_per_second)\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert len(running) >= 3 and set(running) == {"0.0"}  # idle now: no batch, no rate (not the last step's)


def _counts(url: str) -> dict[str, float]:
    """The finish, disconnect and token counters (all reasons) and the latency histograms' sample counts."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counted = ("requests_finished_total", "client_disconnects_total", "e2e_request_latency", "time_to_first_token")
    counted += ("inter_token_latency", "prompt_tokens_total", "generation_tokens_total")
    counts: dict[str, float] = {}
    for name, value in re.findall(r"^dayzero_(\w+)(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE):
        if name.removesuffix("_seconds_count") in counted:
            counts[name] = counts.get(name, 0.0) + float(value)
    return counts


def test_the_metrics_add_up_what_the_answers_said(stack):
    """A body of two prompts and a stream of two choices: the finishes, the latency samples (a gap
    per token after each choice's first) and the token counters grow by what their usage says."""
    before = _counts(stack.url)
    body = {"model": MODEL, "prompt": [[0, 5, 6], [0, 7]], "max_tokens": 3, "ignore_eos": True}
    answered = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).json()["usage"]
    body = chat("two of them", max_tokens=5, ignore_eos=True, n=2, stream=True, **USAGE)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        streamed = [data for _, data in sse_events(r) if data != "[DONE]"][-1]["usage"]
    after = _counts(stack.url)
    grown = {name: after[name] - before.get(name, 0.0) for name in after}
    completions = answered["completion_tokens"] + streamed["completion_tokens"]
    assert completions == 2 * 3 + 2 * 5
    assert grown["requests_finished_total"] == 4 and grown["client_disconnects_total"] == 0
    assert grown["time_to_first_token_seconds_count"] == grown["e2e_request_latency_seconds_count"] == 4
    assert grown["inter_token_latency_seconds_count"] == completions - 4
    assert grown["generation_tokens_total"] == completions
    assert grown["prompt_tokens_total"] == answered["prompt_tokens"] + 2 * streamed["prompt_tokens"]  # per choice


def test_a_stream_read_again_is_not_counted_again_and_keeps_its_place(stack):
    """Resuming a finished choice replays it under the response's id and the choice's index; the
    replay adds nothing to the finish and latency metrics (any client could inflate them)."""
    body = chat("twice", max_tokens=4, ignore_eos=True, n=2, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60) as r:
        rids, token = r.headers["x-request-id"].split(","), r.headers["x-resume-token"]
        response_ids = {data["id"] for _, data in sse_events(r) if data != "[DONE]"}
    before = _counts(stack.url)
    assert before["requests_finished_total"] >= 2
    for _ in range(3):
        url = f"{stack.url}/v1/requests/{rids[1]}/stream"
        with httpx.stream("GET", url, headers={"X-Resume-Token": token}, timeout=60) as r:
            replayed = [data for _, data in sse_events(r) if data != "[DONE]"]
        assert replayed[-1]["choices"][0]["finish_reason"] == "length"
        assert {d["id"] for d in replayed} == response_ids and {d["choices"][0]["index"] for d in replayed} == {1}
    assert _counts(stack.url) == before


def test_a_second_reader_that_leaves_a_live_stream_is_no_disconnect_of_its_choice(stack):
    """The choice's own stream finishes; a resumed read of it that left early counted a disconnect
    too (every admitted choice counts once: as finished here)."""
    before = _counts(stack.url)
    body = {"model": MODEL, "prompt": "live", "max_tokens": 256, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as first:
        url = f"{stack.url}/v1/requests/{first.headers['x-request-id']}/stream"
        with httpx.stream("GET", url, headers={"X-Resume-Token": first.headers["x-resume-token"]}) as second:
            next(sse_events(second))
        assert [data for _, data in sse_events(first)][-1] == "[DONE]"
    time.sleep(0.5)  # (the gateway's count of the second reader's leaving, if any)
    after = _counts(stack.url)
    assert after["client_disconnects_total"] == before["client_disconnects_total"]
    assert after["requests_finished_total"] == before["requests_finished_total"] + 1


def test_the_gateway_exposes_no_created_series():
    """A counter's or histogram's ``*_created`` series (prometheus_client's default, one per labelled
    child) grew a scrape by a third and nothing reads it."""
    metrics = GatewayMetrics()
    metrics.responses.labels("200").inc()
    metrics.ttft.observe(0.1)
    metrics.error_sent({"code": "model_not_found"})
    text = generate_latest(metrics.registry).decode()
    assert 'dayzero_http_responses_total{status="200"} 1.0' in text  # (the scrape has the series)
    assert "_created" not in text
