"""The gateway on its own (no workers): admission control, API keys, per-request image limits, the
checks of bodies and prompts."""

from __future__ import annotations

import base64
import json
import random
import time

import httpx
import pytest

from dayzero.stack import Stack

from .conftest import MODEL, data_url, start_gateway_alone


@pytest.fixture(scope="module")
def lone_gateway(demo_dir, tmp_path_factory):
    extra = {
        "DAYZERO_MAX_QUEUED": "2",
        "DAYZERO_API_KEYS": "sesame, other",  # a comma-separated list
        "DAYZERO_METRICS_AUTH": "true",
        "DAYZERO_IMAGE_MAX_COUNT": "2",
        "DAYZERO_MAX_REQUEST_BYTES": str(1 << 20),  # room for a chat far over the context
        "DAYZERO_NO_WORKER_TIMEOUT_S": "3600",  # requests wait here for workers that never come
    }
    stack = start_gateway_alone(demo_dir, tmp_path_factory.mktemp("logs"), extra)
    yield stack
    stack.stop()


KEY = {"Authorization": "Bearer sesame"}
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
    import base64
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


def _post_raw(gateway: Stack, path: str, body: dict) -> httpx.Response:
    """``body`` as JSON with non-ASCII escaped: a lone surrogate travels as ``"\\ud800"``."""
    headers = {**KEY, "content-type": "application/json"}
    return httpx.post(f"{gateway.url}{path}", content=json.dumps(body), headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("path", "messages"),
    [
        ("/v1/chat/completions", [{"role": "user", "content": "a \ud800"}]),
        ("/v1/chat/completions", [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}]),
        ("/tokenize", [{"role": "user", "content": "a \ud800"}]),
    ],
)
def test_chat_text_that_is_not_unicode_is_refused_naming_its_field(lone_gateway, path, messages):
    r = _post_raw(lone_gateway, path, {"model": MODEL, "max_tokens": 3, "messages": messages})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content" and "lone surrogate" in error["message"], error


@pytest.mark.parametrize(
    ("prompt", "stream", "param"),
    [("a \udfff", False, "prompt"), ("a \udfff", True, "prompt"), (["ok", "a \udfff"], False, "prompt[1]")],
)
def test_a_completions_prompt_that_is_not_unicode_is_refused_naming_it(lone_gateway, prompt, stream, param):
    r = _post_raw(
        lone_gateway, "/v1/completions", {"model": MODEL, "max_tokens": 3, "prompt": prompt, "stream": stream}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "integer" not in r.json()["error"]["message"]  # not another prompt form's complaint


def test_a_chat_far_over_the_context_is_refused_from_its_size(lone_gateway):
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x" * 300_000}]}
    r = httpx.post(f"{lone_gateway.url}/v1/chat/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    # BOS 29 + <｜User｜> 12 + 300000 + <｜Assistant｜> 17 + </think> 8 bytes; no demo model token stands for
    # over 12 bytes (" punctuation"), and at most 10 added ones (at its 4 "<" and 6 "｜") of at most 29
    at_least = 10 + -(-(29 + 12 + 300_000 + 17 + 8 - 10 * 29) // 12)
    assert r.json()["error"]["message"] == f"the prompt has at least {at_least} tokens; the context limit is 4096"
    assert r.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_space_free_prompt_over_the_context_is_refused_from_its_first_pieces(lone_gateway, path):
    """40,000 characters of base64 against 4,096: under the byte bound (49,152 bytes at 12 a token) and
    no space for a head, it was tokenized whole and refused by its count ("the prompt has 39,6xx
    tokens"); now by its first piece's tokens (dayzero.prompt_pieces), the same 400 otherwise."""
    prompt = base64.b64encode(random.Random(0).randbytes(30_000)).decode()
    body = {"model": MODEL, "max_tokens": 3}
    body |= {"prompt": prompt} if path == "/v1/completions" else {"messages": [{"role": "user", "content": prompt}]}
    r = httpx.post(f"{lone_gateway.url}{path}", json=body, headers=KEY, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
    assert error["type"] == "invalid_request_error" and error["param"] == ("prompt" if "prompt" in body else "messages")
    assert error["message"].startswith("the prompt has at least ") and error["message"].endswith(" limit is 4096")


@pytest.mark.parametrize("prompt", [[5] * 5000, "hello " * 5000])
def test_a_completions_prompt_over_the_context_is_refused_naming_prompt(lone_gateway, prompt):
    body = {"model": MODEL, "max_tokens": 3, "prompt": prompt}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("prompt", "param", "message"),
    [
        ([[1, 2], []], "prompt[1]", "prompt 1: the prompt is empty"),
        ([[1], [-1]], "prompt[1]", "prompt 1: prompt token ids must be in [0, 512)"),
        ([[1], [2], [10**9]], "prompt[2]", "prompt 2: prompt token ids must be in [0, 512)"),
        ([[5] * 5000, [1]], "prompt[0]", "prompt 0: the prompt has 5000 tokens; the context limit is 4096"),
        (["text", [1]], "prompt", "prompt: prompt 1 is a token-id list and prompt 0 a string: the prompts must all"),
        ([[1], "text"], "prompt", "prompt: prompt 1 is a string and prompt 0 a token-id list: the prompts must all"),
        ([[1], None], "prompt", "prompt: prompt 1 is neither a string nor a token-id list and prompt 0 a token-id"),
        ([[1]] * 33, "prompt", "prompt: at most 32 prompts in one request"),
    ],
)
def test_several_prompts_are_refused_naming_the_one_at_fault(lone_gateway, prompt, param, message):
    """Token-id lists: which of several was empty, out of the vocabulary or over the context went
    unsaid (param "prompt"); prompts of mixed kinds were refused as the first union branch saw them
    ("prompt[0]: Input should be a valid integer" for ["text", [1]], whose prompt 0 is a string)."""
    body = {"model": MODEL, "max_tokens": 3, "prompt": prompt}
    r = httpx.post(f"{lone_gateway.url}/v1/completions", json=body, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(message), error


def test_content_parts_and_tool_calls_are_bounded_in_all_messages_together(lone_gateway):
    """Each part and call is validated on the event loop before anything else runs: 256 messages of
    1,024 parts (7.9 MB) stalled every stream ~2 s, to be refused over the context after. At the
    bound (4,096), a chat of empty parts is taken (rendered, then refused for the context); one more
    is refused, counted before validation."""
    empty, call = {"type": "text", "text": ""}, {"id": "c", "type": "function", "function": {"name": "f"}}
    messages = [{"role": "user", "content": [empty] * 1024}] * 3 + [{"role": "user", "content": [empty] * 1023}]
    messages += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c", "content": ""}]
    body = {"model": MODEL, "messages": messages}
    at_bound = httpx.post(f"{lone_gateway.url}/tokenize", json=body, headers=KEY, timeout=30)  # rendered, counted:
    assert at_bound.json()["error"]["code"] == "context_length_exceeded", at_bound.text  # 8,249 tokens, over 4,096
    body["messages"] = [*messages, {"role": "user", "content": [empty]}]
    message = "messages: at most 4096 content parts and tool calls in all messages, not 4097"
    for path in ("/tokenize", "/v1/chat/completions"):
        r = httpx.post(f"{lone_gateway.url}{path}", json=body, headers=KEY, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "array_above_max_length",
        }


def test_too_many_messages_are_refused_before_their_parts_are_counted(lone_gateway):
    """The parts' count went through every message first: 2 M empty messages (8 MiB) were counted on
    the event loop for ~0.5 s before the messages' own bound refused them. Past 256 messages their
    bound answers, whatever the parts."""
    messages = [{"role": "user", "content": [{"type": "text", "text": ""}] * 16}] * 257  # 4,112 parts
    r = httpx.post(f"{lone_gateway.url}/tokenize", json={"model": MODEL, "messages": messages}, headers=KEY, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "messages: at most 256 items, not 257", r.json()
