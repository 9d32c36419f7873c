"""/tokenize renders a chat exactly as /v1/chat/completions does, and both refuse the image
placeholder typed into any text that enters the prompt (the gateway in-process, on a real Redis,
no workers: chat requests here are refused before they queue).

Chat's prompt length is read off its context refusal: ``max_tokens`` one past what /tokenize's
count leaves gets "prompt (N) + max_tokens (M) exceeds the context limit"."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, data_url

CONTEXT = 4096  # at most max_tokens_limit: a prompt + max_tokens past it is refused for the context
TAG = "<｜deepseek_image｜>"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "description": "look it up", "parameters": SCHEMA}}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, max_context=CONTEXT)
    with TestClient(make_app(settings)) as client:
        yield client


def _user(text: str, image: bool = False) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(28, 28, 0)}}] if image else []
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _chat_prompt_tokens(gateway, body: dict, count: int) -> int:
    r = gateway.post("/v1/chat/completions", json={**body, "max_tokens": CONTEXT - count + 1})
    assert r.status_code == 400, r.text
    found = re.fullmatch(
        rf"prompt \((\d+)\) \+ max_tokens \(\d+\) exceeds the context limit {CONTEXT}", r.json()["error"]["message"]
    )
    assert found, r.text
    return int(found[1])


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}},
        {"tools": [TOOL], "tool_choice": "required"},
        {"tools": [TOOL], "tool_choice": "none"},
        {"reasoning_effort": "high"},
        {"chat_template_kwargs": {"thinking": True, "reasoning_effort": "max"}, "tools": [TOOL]},
        {"messages": [*_user("give json"), {"role": "assistant", "content": "{", "prefix": True}]},
    ],
    ids=["plain", "json_object", "json_schema", "tools_required", "tools_none", "effort", "thinking", "prefix"],
)
def test_tokenize_counts_the_prompt_chat_is_given(gateway, extra):
    body = {"model": MODEL, "messages": _user("give json", image=True), **extra}
    tokenized = gateway.post("/tokenize", json=body)
    assert tokenized.status_code == 200, tokenized.text
    count = tokenized.json()["count"]
    assert _chat_prompt_tokens(gateway, body, count) == count


def test_tokenize_shows_the_response_format_section(gateway):
    body = {"model": MODEL, "messages": _user("give json")}
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
    ids = gateway.post("/tokenize", json={**body, "response_format": rf}).json()["tokens"]
    prompt = gateway.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    section = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
    assert section + '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}' in prompt


STRICT = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}


@pytest.mark.parametrize(
    "constraint", [{"response_format": {"type": "json_object"}}, {"tools": [STRICT]}], ids=["json", "strict_tool"]
)
def test_tokenize_refuses_a_prefix_chat_would_not_continue(gateway, constraint):
    messages = [*_user("q"), {"role": "assistant", "content": "{", "prefix": True}]
    body = {"model": MODEL, "messages": messages, **constraint}  # (a strict tool: held under auto too)
    for route in ("/tokenize", "/v1/chat/completions"):
        r = gateway.post(route, json=body)
        assert r.status_code == 400 and "a prefix cannot be continued" in r.json()["error"]["message"], r.text


TAGGED = {
    "tools": {"tools": [{"type": "function", "function": {"name": "f", "description": TAG * 3}}]},
    "tools_parameter": {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "string", "description": TAG}}},
                },
            }
        ]
    },
    "response_format": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object", "description": TAG * 2}},
        }
    },
}


@pytest.mark.parametrize("image", [False, True], ids=["no_image", "image"])
@pytest.mark.parametrize("where", list(TAGGED))
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_the_image_placeholder_in_tool_or_schema_text_is_refused(gateway, route, where, image):
    # max_tokens past the context: a chat let through is refused later, never queued
    body = {"model": MODEL, "messages": _user("x", image=image), "max_tokens": CONTEXT, **TAGGED[where]}
    r = gateway.post(route, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == where.split("_parameter")[0] and error["type"] == "invalid_request_error"
    assert error["message"].endswith(f"{TAG} stands for an attached image and must not appear in text"), error


def test_the_image_placeholder_in_past_call_arguments_is_refused(gateway):
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": f'{{"a": "{TAG}"}}'}}
    messages = [
        *_user("q"),
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    r = gateway.post("/tokenize", json={"model": MODEL, "messages": messages, "tools": [TOOL]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_a_completions_text_prompt_holding_the_image_placeholder_is_refused(gateway):
    """Completions take no images: the placeholder typed into a text prompt would stand for none."""
    r = gateway.post("/v1/completions", json={"model": MODEL, "prompt": f"a{TAG}b", "max_tokens": CONTEXT})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt" and error["message"].endswith("must not appear in text"), error


def test_tokenize_takes_vllms_add_special_tokens(gateway):
    """vLLM's: a prompt gets the tokenizer's BOS unless add_special_tokens is false (it was added
    anyway); a chat gets none added (its encoding writes its own BOS: kept), and true there is refused."""

    def tokens(**body) -> list[int]:
        r = gateway.post("/tokenize", json={"model": MODEL, **body})
        assert r.status_code == 200, r.text
        assert r.json()["count"] == len(r.json()["tokens"])
        return r.json()["tokens"]

    with_bos = tokens(prompt="hello world")
    assert tokens(prompt="hello world", add_special_tokens=True) == with_bos
    assert tokens(prompt="hello world", add_special_tokens=False) == with_bos[1:]
    text = gateway.post("/detokenize", json={"model": MODEL, "tokens": with_bos[:1]}).json()["prompt"]
    assert text == "<｜begin▁of▁sentence｜>", text
    chat = tokens(messages=_user("hi"))
    assert tokens(messages=_user("hi"), add_special_tokens=False) == chat and chat[0] == with_bos[0]
    refused = gateway.post("/tokenize", json={"model": MODEL, "messages": _user("hi"), "add_special_tokens": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "add_special_tokens", refused.text


def test_the_ids_are_written_by_pydantic_not_walked_by_jsonable_encoder(gateway, monkeypatch):
    """/tokenize returned a dict: FastAPI's jsonable_encoder walked every id in Python on the event
    loop (~0.8 s for 1 M ids, a prompt of 1 M characters); its response model is written in Rust."""
    import fastapi.routing

    walked, walk = [], fastapi.routing.jsonable_encoder
    monkeypatch.setattr(
        fastapi.routing, "jsonable_encoder", lambda obj, *a, **k: walked.append(obj) or walk(obj, *a, **k)
    )
    r = gateway.post("/tokenize", json={"model": MODEL, "prompt": "hello world"})
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 1, r.text
    assert [w for w in walked if isinstance(w, dict) and "tokens" in w] == []


@pytest.mark.parametrize(
    "body, at_least",
    [
        ({"prompt": "x" * (CONTEXT + 100)}, False),  # a token a character: over the context, counted
        ({"prompt": "x" * (1 << 20)}, True),  # 1 MB: over it from its size alone, untokenized
        ({"messages": _user("x" * (CONTEXT + 100))}, False),
    ],
    ids=["prompt", "prompt_far_over", "chat"],
)
def test_tokenize_refuses_a_prompt_over_the_context_as_the_routes_do(gateway, body, at_least):
    """A prompt text had no bound: 1 M characters were tokenized (1.9 s of CPU) and counted."""
    r = gateway.post("/tokenize", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text[:200]
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == next(iter(body)), error
    assert ("at least" in error["message"]) == at_least and error["message"].endswith(f"limit is {CONTEXT}"), error


def test_detokenize_takes_up_to_the_context_and_refuses_more_and_ids_outside_the_vocabulary(gateway):
    """Past the context the ids are refused before the tokenizer decodes them (it holds the event loop:
    ~1 s for the 1 M ids the schema lets through, every stream of the gateway waiting)."""

    def detokenize(tokens: list[int]):
        return gateway.post("/detokenize", json={"model": MODEL, "tokens": tokens})

    assert detokenize([5] * CONTEXT).status_code == 200
    refused = detokenize([5] * (CONTEXT + 1))
    assert refused.status_code == 400, refused.text[:200]
    assert refused.json()["error"]["code"] == "context_length_exceeded" and refused.json()["error"]["param"] == "tokens"
    for outside in (-1, 512):
        refused = detokenize([5] * 10 + [outside])
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens", refused.text[:200]
