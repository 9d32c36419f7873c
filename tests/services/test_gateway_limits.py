"""The gateway on its own (no workers, ``lone_gateway``): admission control, API keys, per-request
image limits, the checks of bodies (prompts': test_gateway_prompt_limits)."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from .conftest import KEY, MODEL, data_url

OTHER = {"Authorization": "Bearer other"}


def _image_chat(*urls: str, stream: bool = False) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": MODEL, "messages": [{"role": "user", "content": parts}], "stream": stream}


def test_a_stream_is_readable_only_by_the_key_that_created_it(lone_gateway):
    url = f"{lone_gateway.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=_image_chat(data_url(20, 20, 1), stream=True), headers=KEY, timeout=10) as r:
        assert r.status_code == 200  # waits at the vision stage: no worker here
        rid = r.headers["x-request-id"]
    resume = f"{lone_gateway.url}/v1/requests/{rid}/stream"
    refused = httpx.get(resume, headers={**OTHER, "Last-Event-ID": "0-0"}, timeout=10)
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "invalid_request_error"
    with httpx.stream("GET", resume, headers=KEY, timeout=10) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line)
    assert first == "retry: 1000"  # EventSource's reconnect delay, well inside the cancel grace


def _flat_png(width: int, height: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (40, 90, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_image_count_and_sizes_are_checked_before_any_decoding(lone_gateway):
    url = f"{lone_gateway.url}/v1/chat/completions"
    corrupt = "data:image/png;base64,iVBORw0KGgoAAAAN"  # a PNG signature, then nothing
    r = httpx.post(url, json=_image_chat(corrupt, corrupt, corrupt), headers=KEY, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"
    r = httpx.post(url, json=_image_chat(_flat_png(10000, 10)), headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    assert "aspect ratio" in r.json()["error"]["message"]


def test_metrics_need_the_key_and_probes_are_not_counted(lone_gateway):
    assert httpx.get(f"{lone_gateway.url}/ready", timeout=5).status_code == 503  # no workers
    assert httpx.get(f"{lone_gateway.url}/metrics", timeout=5).status_code == 401
    text = httpx.get(f"{lone_gateway.url}/metrics", headers=KEY, timeout=5).text
    assert 'dayzero_http_responses_total{status="404"}' in text  # the API's own answers count
    assert 'status="503"' not in text


def test_api_key_required_when_configured(lone_gateway):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 1}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"
    for refused in ("Bearer wrong", "sesame", "Basic sesame", "Bearersesame"):  # the key, but not as a bearer
        r = httpx.get(f"{lone_gateway.url}/v1/models", headers={"Authorization": refused}, timeout=10)
        assert r.status_code == 401, refused
    for accepted in ("Bearer sesame", "bearer  sesame"):  # the scheme is case-insensitive (RFC 7235)
        r = httpx.get(f"{lone_gateway.url}/v1/models", headers={"Authorization": accepted}, timeout=10)
        assert r.status_code == 200, accepted
    utf8 = {"Authorization": "Bearer sesamé".encode()}  # no key matches bytes beyond ASCII: 401, not a 500
    assert httpx.get(f"{lone_gateway.url}/v1/models", headers=utf8, timeout=10).status_code == 401


def test_full_queue_answers_429_with_retry_after(lone_gateway):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 1, "stream": True}
    statuses = []
    for _ in range(4):  # nothing consumes the prefill queue: two fit, then it is full
        with httpx.stream("POST", f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=10) as r:
            statuses.append((r.status_code, r.headers.get("retry-after")))
    assert [s for s, _ in statuses] == [200, 200, 429, 429]
    assert statuses[-1][1] == "1"
    assert httpx.get(f"{lone_gateway.url}/ready", timeout=10).status_code == 503  # no workers alive


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_more_choices_than_the_queue_holds_are_a_400_not_a_429_for_ever(lone_gateway, path):
    """DAYZERO_MAX_QUEUED=2 and n=3: every try answered 429 queue_full (retry shortly), even on
    an idle server; a client that honours Retry-After retried for ever."""
    body = {"model": MODEL, "max_tokens": 1, "n": 3}
    body |= {"prompt": [0, 5]} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{lone_gateway.url}{path}", json=body, headers=KEY, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "n" and "DAYZERO_MAX_QUEUED" in error["message"]
    if path == "/v1/completions":  # a list of prompts, one choice each: the client sent no n
        listed = httpx.post(f"{lone_gateway.url}{path}", json={**body, "n": 1, "prompt": [[0], [5], [6]]}, headers=KEY)
        assert listed.status_code == 400 and listed.json()["error"]["param"] == "prompt", listed.text


def test_too_many_images_in_one_request(lone_gateway):
    parts = [{"type": "image_url", "image_url": {"url": data_url(20, 20, i)}} for i in range(3)]
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}]}
    r = httpx.post(f"{lone_gateway.url}/v1/chat/completions", json=body, headers=KEY, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"


def test_waiting_stream_sends_keep_alive_comments(lone_gateway):
    # an image request waits at the vision stage, which has no worker here (its own queue bound)
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": data_url(20, 20, 5)}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": parts}], "stream": True}
    comments, start = [], time.time()
    with httpx.stream("POST", f"{lone_gateway.url}/v1/chat/completions", json=body, headers=KEY, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(":"):
                comments.append(line)
            if len(comments) >= 2 or time.time() - start > 6:
                break
    assert len(comments) >= 2  # keep-alive every DAYZERO_KEEPALIVE_S (1 s here) while nothing arrives


@pytest.mark.parametrize(
    ("field", "value"),
    [("stop", ""), ("stop", ["ok", ""]), ("temperature", 1e-310), ("seed", 2**63)],
)
def test_parameters_sampling_cannot_run_are_refused_naming_them(lone_gateway, field, value):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 1, field: value}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(field), r.json()


def test_a_body_that_is_not_json_is_refused_saying_where(lone_gateway):
    r = httpx.post(
        f"{lone_gateway.url}/v1/completions",
        content=b'{"model": "x", bad}',
        headers={**KEY, "content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "the body is not valid JSON: Expecting property name enclosed in double quotes (at character 15)",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_json",
    }


def test_stream_options_without_stream_are_refused(lone_gateway):
    body = {"model": MODEL, "prompt": [0, 5], "max_tokens": 1, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options" and "stream is true" in r.json()["error"]["message"]
