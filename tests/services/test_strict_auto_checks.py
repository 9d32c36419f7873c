"""A ``strict`` tool under tool_choice "auto" is held by a grammar, so the gateway checks what it
holds as under required: a strict tool's schema it cannot enforce is refused (a tool that is not
strict is only read by the model: any schema goes), and ``parallel_tool_calls: false`` is served.
The gateway in-process on a real Redis, no workers: a request let through is refused after its
grammar compiled, for max_tokens past the context, never queued."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import MODEL

CONTEXT = 4096
PATTERN = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}


def _tool(strict: bool, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": strict}}


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url, max_context=CONTEXT))) as client:
        yield client


def _post(gateway, **body):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, **body})


def _past_the_grammar(r) -> bool:
    return r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("choice", [{"tool_choice": "auto"}, {}], ids=["auto", "default"])
def test_a_strict_schema_no_grammar_can_enforce_is_refused_under_auto(gateway, choice):
    r = _post(gateway, tools=[_tool(True, PATTERN)], **choice)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "pattern" in error["message"], error
    assert _past_the_grammar(_post(gateway, tools=[_tool(False, PATTERN)], **choice))  # only read: served


@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_a_strict_tool_under_auto_is_served_one_call_at_most_too(gateway, thinking):
    tools = [_tool(True, {"type": "object", "properties": {"n": {"type": "integer"}}}), _tool(False, {})]
    tools[1]["function"]["name"] = "g"
    mode = {"chat_template_kwargs": {"thinking": thinking}}
    assert _past_the_grammar(_post(gateway, tools=tools, parallel_tool_calls=False, **mode))
