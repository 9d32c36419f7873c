"""``parallel_tool_calls: false`` (LangChain's structured output sends it with a named tool_choice)
is served where a reply can be held to one call: tool_choice required (its grammar takes one call)
or named (one call already), under auto with a strict tool (its grammar holds every call block to
one call), and where no call can come (no tools, tool_choice none). Else under auto the model may
write several: 400. A strict tool's schema is checked under auto as under required. The gateway
in-process on a real Redis, no workers: a request let through is refused after its grammar
compiled, for max_tokens past the context, never queued."""

from __future__ import annotations

import pytest

from .conftest import CAPPED_CONTEXT as CONTEXT
from .conftest import MODEL

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("f", "g")]
PATTERN = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}


@pytest.fixture(scope="module")
def gateway(capped_gateway):
    return capped_gateway


def _post(gateway, **body):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, "parallel_tool_calls": False, **body})


@pytest.mark.parametrize(
    "body",
    [
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "g"}}},
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": "none"},
        {},
    ],
    ids=["named", "required", "none", "no_tools"],
)
def test_one_call_at_most_is_served(gateway, body):
    r = _post(gateway, **body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


@pytest.mark.parametrize("choice", [{"tool_choice": "auto"}, {}], ids=["auto", "default"])
def test_several_calls_the_server_cannot_prevent_are_refused(gateway, choice):
    r = _post(gateway, tools=TOOLS, **choice)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "parallel_tool_calls" and "tool_choice" in error["message"], error


def _strict(tool: dict, parameters: dict | None = None) -> dict:
    function = {**tool["function"], "strict": True}
    return {**tool, "function": function if parameters is None else {**function, "parameters": parameters}}


@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
def test_a_strict_tool_holds_auto_to_one_call(gateway, thinking):
    r = _post(gateway, tools=[_strict(TOOLS[0]), TOOLS[1]], chat_template_kwargs={"thinking": thinking})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


@pytest.mark.parametrize("choice", [{"tool_choice": "auto"}, {}], ids=["auto", "default"])
def test_a_strict_schema_no_grammar_can_enforce_is_refused_under_auto(gateway, choice):
    r = _post(gateway, tools=[_strict(TOOLS[0], PATTERN)], parallel_tool_calls=None, **choice)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "pattern" in error["message"], error
    plain = {**TOOLS[0], "function": {**TOOLS[0]["function"], "parameters": PATTERN}}  # only read: served
    r = _post(gateway, tools=[plain], parallel_tool_calls=None, **choice)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_strict_tool_beside_a_json_reply_is_only_read(gateway):
    """With response_format the JSON reply's grammar applies under auto, no call's (README): a strict
    tool's parameters no call grammar can keep are only read, as a plain tool's."""
    unkept = {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}
    reply = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    r = _post(gateway, tools=[_strict(TOOLS[0], unkept)], response_format=reply, parallel_tool_calls=None)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
