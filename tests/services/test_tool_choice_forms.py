"""OpenAI's newer forms of a tool choice and a tool, as openai-python types them
(ChatCompletionAllowedToolChoiceParam: {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}};
ChatCompletionNamedToolChoiceCustomParam: {"type": "custom", "custom": {"name"}};
ChatCompletionCustomToolParam: {"type": "custom", "custom": {"name", ...}}): this server serves none
of them, and says so (unsupported_value naming the form), as it does for OpenAI's parameters it does
not implement. The gateway in-process on a real Redis: each request here is refused before it queues."""

from __future__ import annotations

import pytest

from .conftest import MODEL

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ALLOWED = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [NAMED]}}
CUSTOM_TOOL = {"type": "custom", "custom": {"name": "grep", "description": "free text in"}}


@pytest.mark.parametrize(
    ("fields", "param", "told"),
    [
        ({"tools": [WEATHER], "tool_choice": ALLOWED}, "tool_choice.type", "type 'allowed_tools'"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "custom", "custom": {"name": "grep"}}},
            "tool_choice.type",
            "type 'custom'",
        ),
        ({"tools": [WEATHER, CUSTOM_TOOL]}, "tools[1].type", "type 'custom'"),
        (
            {"tools": [CUSTOM_TOOL], "tool_choice": {"type": "custom", "custom": {"name": "grep"}}},
            "tools[0].type",
            "type 'custom'",
        ),
    ],
    ids=["allowed_tools", "custom choice", "custom tool", "custom tool and choice"],
)
def test_openai_s_newer_tool_forms_are_unsupported_values(capped_gateway, fields, param, told):
    """Each was a 400 invalid_value, "Input should be 'function'" (the client told its request was
    malformed, not that the server lacks the form)."""
    for path in ("/v1/chat/completions", "/tokenize"):
        r = capped_gateway.post(path, json={"model": MODEL, "messages": [{"role": "user", "content": "q"}], **fields})
        error = r.json()["error"]
        assert (r.status_code, error["param"], error["code"]) == (400, param, "unsupported_value"), error
        assert error["message"].startswith(f"{param}: {told} (") and "not supported by this server" in error["message"]


def test_a_function_tool_choice_is_still_served(capped_gateway):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "tools": [WEATHER], "tool_choice": NAMED}
    assert capped_gateway.post("/tokenize", json=body).status_code == 200
    wrong = {**body, "tool_choice": {"type": "functions", "function": {"name": "get_weather"}}}
    error = capped_gateway.post("/tokenize", json=wrong).json()["error"]
    assert (error["param"], error["code"]) == ("tool_choice.type", "invalid_value"), error


def test_a_tool_before_a_custom_one_is_told_its_own_error(capped_gateway):
    """A malformed function tool before a custom one was hidden by it: the custom tool was told first
    (tools[1].type), where before the custom check the first tool's name was (tools[0].function.name);
    a custom tool first is still told first."""
    bad = {"type": "function", "function": {"name": "get weather"}}  # (a space: no tool name)
    for tools, param in (([bad, CUSTOM_TOOL], "tools[0].function.name"), ([CUSTOM_TOOL, bad], "tools[0].type")):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "tools": tools}
        error = capped_gateway.post("/tokenize", json=body).json()["error"]
        assert error["param"] == param, error
