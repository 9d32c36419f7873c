"""What a reply under a schema could never write is refused at admission, through the HTTP API as
a client meets it (a 400 in our words, not a stream broken past a 200); what it can write is let
through. The gateway in-process on a real Redis, no workers: a request let through is refused for
max_tokens past the context, never queued."""

from __future__ import annotations

import string

import pytest

from dayzero.chat.schema_splits import MOST_AFTER_UNBOUNDED

from .conftest import CAPPED_CONTEXT, MODEL

NEAR_LEAST_I64 = -(2**63) + 1  # a bound llguidance crashed on (schema_bounds)
LONG_NAME = string.ascii_uppercase + string.digits + "-hjqwxyzbd"  # (a tool's name: bytes no DSML tag spells)


def _post(gateway, schema: dict):
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CAPPED_CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, "response_format": response_format})


def _let_through(r) -> bool:
    return r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def _refused(r) -> str:
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    return r.json()["error"]["message"]


def _pattern(regex: str) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", "pattern": regex}}, "required": ["s"]}


def test_a_counted_group_of_varying_length_past_the_lexer_is_refused(capped_gateway):
    """Counted 3,800 characters, let through: every reply writing it failed 1,106 characters in."""
    message = _refused(_post(capped_gateway, _pattern("^(.{1,2}){1900}$")))
    assert "a regular expression repeating a group of varying length" in message, message
    assert _let_through(_post(capped_gateway, _pattern("^(.{1,2}){300}$")))


def test_a_count_after_an_unbounded_repeat_past_the_lexer_is_refused(capped_gateway):
    """Counted 2,000 characters, no group, let through: every reply writing on past it failed ~1,060
    characters in (in this open object; 1,558 in a closed one)."""
    message = _refused(_post(capped_gateway, _pattern("^.*.{2000}$")))
    assert "after a repeat without bound of the same characters" in message, message
    assert _let_through(_post(capped_gateway, _pattern(f"^.*.{{{MOST_AFTER_UNBOUNDED}}}$")))  # (its open bound)
    assert _let_through(_post(capped_gateway, _pattern("^[a-z]*[0-9]{2000}$")))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "example": {"minimum": NEAR_LEAST_I64}},
        {"type": "integer", "x-range": {"minimum": NEAR_LEAST_I64, "const": NEAR_LEAST_I64}},
        {"type": "integer", "examples": [{"enum": [NEAR_LEAST_I64]}]},
    ],
    ids=["example", "extension", "examples"],
)
def test_a_bound_in_the_clients_data_is_not_read(capped_gateway, schema):
    """An OpenAPI ``example`` or an ``x-`` extension is data llguidance never compiles: its
    "minimum" was read as a bound and the schema refused."""
    assert _let_through(_post(capped_gateway, schema))


def test_a_bound_a_ref_reaches_in_data_is_still_refused(capped_gateway):
    """llguidance follows a $ref anywhere in the document: there the bound is compiled."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/x-range"}}, "required": ["a"]}
    schema["x-range"] = {"type": "integer", "minimum": NEAR_LEAST_I64}
    assert "64-bit range" in _refused(_post(capped_gateway, schema))


def test_long_pattern_names_past_the_pairs_bound_are_refused(capped_gateway):
    """64 patternProperties' names of 144 bytes, within the 10,000 characters of patterns: llguidance
    checks each pair for an overlap (580,608 bytes read); a 400 naming the bound, before any compile."""
    names = {f"^{'a' * 140}{i:02d}$": {"type": "integer"} for i in range(64)}
    message = _refused(_post(capped_gateway, {"type": "object", "patternProperties": names}))
    assert "580,608 bytes read" in message and "at most 100,000 can be enforced" in message, message


def _forced_call(gateway, name: str, count: int):
    run = {"type": "string", "pattern": f"^.*.{{{count}}}$"}
    closed = {"type": "object", "properties": {"s0": run}, "required": ["s0"], "additionalProperties": False}
    parameters = {"type": "object", "properties": {"o": closed}, "required": ["o"]}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CAPPED_CONTEXT}
    tools = [{"type": "function", "function": {"name": name, "parameters": parameters}}]
    return gateway.post("/v1/chat/completions", json={**chat, "tools": tools, "tool_choice": "required"})


def test_a_forced_calls_tool_name_counts_toward_its_bound(capped_gateway):
    """A forced call's tag spells its tool's name: ``.*.{600}`` (forced calls' bound) beside a name of
    46 bytes no tag spells was let through, and every call writing on past 560 failed; refused now,
    where beside the name "f" it is let through."""
    refused = _forced_call(capped_gateway, LONG_NAME, 600)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools", refused.text
    assert "byte classes apart" in refused.json()["error"]["message"]
    assert _let_through(_forced_call(capped_gateway, "f", 600))
