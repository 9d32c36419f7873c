"""Each refusal of a body's field says what is wrong in its ``code`` (a lone surrogate, a list past its
bound, an empty string: they were null), and names the field as OpenAI's ``param`` writes it, a map's
key too (the gateway in-process, on a real Redis: every request here is refused before it queues)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL, chat

TEXT = 1 << 20  # token ids one prompt takes (as characters its text)


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _error(gateway, path: str, body: dict) -> dict:
    """The error of ``body`` sent as json.dumps writes it (a lone surrogate as ``"\\ud800"``)."""
    r = gateway.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    return r.json()["error"]


def _tool(properties: dict) -> dict:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def _completion(prompt: object, **kw) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 1, **kw}


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        (CHAT, chat("a \ud800"), "messages[0].content", "invalid_unicode"),
        (COMPLETIONS, _completion("a \ud800"), "prompt", "invalid_unicode"),
        (
            CHAT,
            chat("hi", tools=[_tool({"x": {"type": "string", "description": "\ud800"}})]),
            "tools[0].function.parameters.properties.x.description",
            "invalid_unicode",
        ),
        (COMPLETIONS, _completion(["a"] * 33), "prompt", "array_above_max_length"),
        (CHAT, chat("hi", stop=[f"s{i}" for i in range(17)]), "stop", "array_above_max_length"),
        (CHAT, chat("hi", stop=""), "stop", "empty_string"),
        (CHAT, chat("hi", stop=["a", ""]), "stop[1]", "empty_string"),
    ],
    ids=[
        "surrogate in content",
        "surrogate in a prompt",
        "surrogate in a tool (tokenized)",
        "33 prompts",
        "17 stops",
        "empty stop",
        "empty stop of several",
    ],
)
def test_a_refused_field_is_coded(gateway, path, body, param, code):
    error = _error(gateway, path, body)
    assert (error["param"], error["code"]) == (param, code), error


def test_one_of_several_prompts_of_token_ids_is_bounded_as_one_prompt_is(gateway):
    """They were bounded by the body's size alone (8 MiB: 4 M one-digit ids, each validated)."""
    error = _error(gateway, COMPLETIONS, _completion([[1, 2], [1] * (TEXT + 1)]))
    assert (error["param"], error["code"]) == ("prompt[1]", "array_above_max_length"), error
    one = _error(gateway, COMPLETIONS, _completion([1] * (TEXT + 1)))  # (the bound of a single prompt)
    assert (one["param"], one["code"]) == ("prompt", "array_above_max_length"), one


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({"topic": 1}, "metadata.topic"),  # (OpenAI's form: "metadata.response_format")
        ({"str": 1}, "metadata.str"),  # a key spelled as a type's tag (it named the map)
        ({"a]b.c": 1}, 'metadata["a]b.c"]'),  # (it named the map: "metadata.a]b.c" reads as two fields)
        ({'say "hi"': 1}, 'metadata["say \\"hi\\""]'),
    ],
)
def test_a_maps_value_is_named_by_its_key_written_so_it_reads_as_one(gateway, metadata, param):
    error = _error(gateway, CHAT, chat("hi", metadata=metadata))
    assert (error["param"], error["code"]) == (param, "invalid_type"), error


def test_a_refused_key_names_its_map(gateway):
    error = _error(gateway, CHAT, chat("hi", logit_bias={"05": 1}))  # (token 5's spelling is "5")
    assert error["param"] == "logit_bias", error


def test_a_lone_surrogate_in_a_key_names_the_object_it_is_in_with_its_path_escaped(gateway):
    properties = {"a.b": {"type": "object", "properties": {"\ud800": {"type": "string"}}}}
    error = _error(gateway, CHAT, chat("hi", tools=[_tool(properties)]))
    assert error["param"] == 'tools[0].function.parameters.properties["a.b"].properties', error
    assert error["code"] == "invalid_unicode", error


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("method", "path", "content", "headers", "status", "code"),
    [
        # the body's own faults (no field to name: they were null)
        ("GET", COMPLETIONS, None, {}, 405, "method_not_allowed"),
        ("POST", COMPLETIONS, b'{"model": "x", bad}', JSON, 400, "invalid_json"),
        ("POST", COMPLETIONS, b'{"model": "\xff"}', JSON, 400, "invalid_json"),  # not UTF-8
        ("POST", COMPLETIONS, b"[" * 5000 + b"]" * 5000, JSON, 400, "invalid_json"),  # nested too deep
        ("POST", COMPLETIONS, b'{"n": 1' + b"0" * 5000 + b"}", JSON, 400, "invalid_json"),  # an endless integer
        ("POST", COMPLETIONS, b'{"model": "x"}', {"content-type": "text/plain"}, 400, "unsupported_content_type"),
        ("POST", COMPLETIONS, b"", JSON, 400, "missing_required_parameter"),
        ("POST", COMPLETIONS, b"[]", JSON, 400, "invalid_type"),
        ("POST", COMPLETIONS, b"null", JSON, 400, "invalid_type"),
        # the server's own checks of a field (they were null)
        ("POST", COMPLETIONS, _completion(["a", [1]]), JSON, 400, "invalid_type"),  # mixed prompt kinds
        ("POST", COMPLETIONS, _completion("a", tools=[_tool({})]), JSON, 400, "unsupported_parameter"),
        ("POST", COMPLETIONS, _completion("a", tool_choice="auto"), JSON, 400, "unsupported_parameter"),
        ("POST", CHAT, chat("a", echo=True), JSON, 400, "unsupported_parameter"),
        ("POST", CHAT, chat("a", chat_template_kwargs={"thinkng": True}), JSON, 400, "unknown_parameter"),
        ("POST", COMPLETIONS, _completion("a", best_of=2), JSON, 400, "unsupported_value"),
        ("POST", COMPLETIONS, _completion("a", min_tokens=3), JSON, 400, "unsupported_value"),
        ("POST", CHAT, chat("a", top_logprobs=2), JSON, 400, "invalid_value"),
        ("POST", CHAT, chat("a", tool_choice="required"), JSON, 400, "invalid_value"),
        ("POST", CHAT, chat("a", stream_options={"include_usage": True}), JSON, 400, "invalid_value"),
        ("POST", CHAT, chat("a", logit_bias={"05": 1}), JSON, 400, "invalid_value"),
        ("POST", CHAT, chat("a", response_format={"type": "json_schema"}), JSON, 400, "invalid_value"),
        ("POST", COMPLETIONS, _completion([10**6]), JSON, 400, "invalid_value"),  # a token id past the vocabulary
        ("POST", COMPLETIONS, _completion("a", logit_bias={"1000000": 1}), JSON, 400, "invalid_value"),
        ("POST", "/detokenize", {"model": MODEL, "tokens": [10**6]}, JSON, 400, "invalid_value"),
        ("GET", "/v1/requests/nobody/stream", None, {}, 404, "request_not_found"),
    ],
    ids=[
        "405",
        "not JSON",
        "not UTF-8",
        "nested too deep",
        "endless integer",
        "not sent as JSON",
        "empty body",
        "a list",
        "null",
        "mixed prompts",
        "tools in completions",
        "tool_choice in completions",
        "echo in chat",
        "a misspelt key of chat_template_kwargs",
        "best_of 2",
        "min_tokens 3",
        "top_logprobs without logprobs",
        "tool_choice without tools",
        "stream_options without stream",
        "logit_bias key 05",
        "json_schema without its schema",
        "prompt id past the vocabulary",
        "logit_bias id past the vocabulary",
        "detokenize id past the vocabulary",
        "unknown request",
    ],
)
def test_every_refusal_carries_a_code(gateway, method, path, content, headers, status, code):
    """Each 4xx names its fault in ``code`` (these were null): OpenAI's where one fits."""
    sent = json.dumps(content) if isinstance(content, dict) else content
    r = gateway.request(method, path, content=sent, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.json()
