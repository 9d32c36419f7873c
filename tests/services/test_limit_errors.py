"""What a body past a bound is told: a string's limit in characters, a list's in items, each with
OpenAI's code (the gateway in-process, on a real Redis: every request here is refused before it
queues); and that no field bounds several kinds of value with one limit."""

from __future__ import annotations

import json
from typing import Union, get_args, get_origin

import pytest
from annotated_types import MaxLen
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway import body_model
from services.gateway.app import make_app  # (imports every body's model)

from .conftest import MODEL

TEXT = 1 << 20  # characters a prompt or a message's content takes
OVER = "x" * (TEXT + 1)


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _bodies(model: type) -> list[type]:
    return [model, *(found for sub in model.__subclasses__() for found in _bodies(sub))]


def test_no_field_bounds_several_kinds_of_value_with_one_limit():
    """A limit on a union is pydantic's "at most N items" for a string too (a message's content over
    1 MiB was told "at most 1048576 items", code array_above_max_length): each kind bounds itself."""
    shared = []
    for model in _bodies(body_model._Body):
        for name, field in model.model_fields.items():
            kinds = [kind for kind in get_args(field.annotation) if kind is not type(None)]
            several = get_origin(field.annotation) in (Union, type(int | str)) and len(kinds) > 1
            if several and any(isinstance(bound, MaxLen) for bound in field.metadata):
                shared.append(f"{model.__name__}.{name}")
    assert shared == []


@pytest.mark.parametrize(
    ("path", "body", "param", "message", "code"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": OVER}]},
            "messages[0].content",
            f"String should have at most {TEXT} characters",
            "string_above_max_length",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": OVER},
            "prompt",
            f"String should have at most {TEXT} characters",
            "string_above_max_length",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": [1] * (TEXT + 1)},
            "prompt",
            f"at most {TEXT} items, not {TEXT + 1}",
            "array_above_max_length",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1025}]},
            "messages[0].content",
            "at most 1024 items, not 1025",
            "array_above_max_length",
        ),
        (
            "/tokenize",
            {"model": MODEL, "prompt": OVER},
            "prompt",
            f"String should have at most {TEXT} characters",
            "string_above_max_length",
        ),
    ],
    ids=["content text", "prompt text", "prompt token ids", "content parts", "tokenize prompt"],
)
def test_a_value_past_its_bound_is_told_in_its_own_units(gateway, path, body, param, message, code):
    r = gateway.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": f"{param}: {message}",
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize(
    ("sent", "shown"),
    [(5000, "5000"), (int("9" * 4300), "99999999999999999999... (4300 digits)")],  # (4300: Python's most)
    ids=["over", "4300 digits"],
)
def test_a_token_limit_past_the_servers_is_coded_and_not_repeated_whole(gateway, field, sent, shown):
    """Its code was null (OpenAI's: invalid_value), and a 4300-digit value was repeated whole."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], field: sent})
    r = gateway.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": f"{field} {shown} exceeds the limit 4096",  # (Settings' max_tokens_limit)
        "type": "invalid_request_error",
        "param": field,
        "code": "invalid_value",
    }


def test_a_bounded_string_with_a_lone_surrogate_is_told_so(gateway):
    """pydantic's words for a bounded string were "unable to parse raw data as a unicode string"."""
    parts = [{"type": "text", "text": "a \ud800"}]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": parts}]})  # (as "\\ud800")
    r = gateway.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[0].text", error
    assert error["message"] == "messages[0].content[0].text: the text has a lone surrogate '\\ud800' (not Unicode)"


def test_a_clients_string_quoted_in_a_message_keeps_its_digits(gateway):
    """Numbers over 20 digits are cut in a message, but not inside a string the client sent: an unknown
    model 'm' + 25 ones was named 'm11111111111111111111... (25 digits)', a name it never sent."""
    name = "m" + "1" * 25
    r = gateway.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "model_not_found"
    assert f"'{name}'" in r.json()["error"]["message"], r.text


def test_echo_with_logprobs_over_its_prompt_bound_is_unsupported_not_over_the_context(gateway):
    """The prompt's logprobs travel in one stream entry, so echo with logprobs takes prompts of up to
    32,768 tokens, a bound of this server's, under a 65,536-token context: it was coded
    context_length_exceeded, which tells a client to shorten a prompt that fits the context."""
    body = {"model": MODEL, "prompt": [5] * 32769, "echo": True, "logprobs": 1, "max_tokens": 1}
    r = gateway.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "unsupported_value"), error
    assert "echo with logprobs takes prompts of up to 32768 tokens" in error["message"], error
    assert (
        gateway.post("/v1/completions", json={**body, "logprobs": None, "max_tokens": 10**6}).json()["error"]["param"]
        == "max_tokens"
    )  # (without logprobs the prompt passes, to be refused for max_tokens: never queued)
