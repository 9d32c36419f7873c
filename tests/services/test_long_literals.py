"""A string one lexeme of a grammar spells (a property name, an enum or const string) or a regular
expression, past a bound a few times under what llguidance's lexer takes, is refused at admission
with a 400 naming it: it passed the size check and the walk of the first bytes, then failed every
reply where the reply reached it (a name of 50,000 characters after ~0.9 s of the gateway's check:
a 400 after a 200 stream began). The gateway in-process on a real Redis, no workers: a request let
through is refused for max_tokens past the context, never queued. The longest let through do compile
and take a whole reply. So with counts of characters: a minLength or a regular expression's {n,m}
past what the lexer holds is refused (``^.{20000}$`` failed at ~16.6 KB of a reply), a maxLength
past it clamped (30,000 failed at ~10 KB)."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_counts import MOST_COUNTED_CHARS
from dayzero.chat.schema_size import MOST_LITERAL_BYTES

from .conftest import CAPPED_CONTEXT as CONTEXT
from .conftest import MODEL
from .test_schema_dialects import _written

LONG = "a" * 50_000


def _post(gateway, **body):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, **body})


def _format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _forced(parameters: dict) -> dict:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    return {"tools": [tool], "tool_choice": "required"}


@pytest.mark.parametrize(
    "body, param, what",
    [
        (_format({"type": "object", "properties": {LONG: {"type": "integer"}}}), "response_format", "a property name"),
        (_forced({"type": "object", "properties": {LONG: {"type": "integer"}}}), "tools", "a property name"),
        (_format({"type": "object", "required": [LONG]}), "response_format", "a required name"),
        (_format({"const": {"k": [LONG]}}), "response_format", "an enum or const string"),
        (_format({"enum": ["b", "a" * 20_000]}), "response_format", "an enum or const string"),
        (_format({"type": "string", "pattern": "^" + "a" * 9_000 + "$"}), "response_format", "a regular expression"),
    ],
    ids=["name", "tool_name", "required", "nested_const", "enum", "pattern"],
)
def test_a_string_past_the_lexer_is_refused_at_admission(capped_gateway, body, param, what):
    r = _post(capped_gateway, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"too big: {what} of " in error["message"], error


def test_the_longest_let_through_are_written_whole(capped_gateway):
    name, text = "n" * MOST_LITERAL_BYTES, "p" * (MOST_LITERAL_BYTES - 2)
    schema = {
        "type": "object",
        "properties": {name: {"const": "c" * MOST_LITERAL_BYTES}, "p": {"type": "string", "pattern": f"^{text}$"}},
        "required": [name, "p"],
    }
    r = _post(capped_gateway, **_format(schema))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert _written(schema, {name: "c" * MOST_LITERAL_BYTES, "p": text})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^[a-z]{6000}$"},  # ~6,000 of the lexer's 50,000 states, not 54,000
        {"type": "string", "example": {"minLength": 5000}, "x-meta": {"pattern": "^.{9000}$"}},  # the client's data
    ],
    ids=["ascii_class", "example_data"],
)
def test_a_schema_costing_the_lexer_little_is_let_through(capped_gateway, schema):
    """Both were refused as too big ("at most 4,000 characters counted") though llguidance compiles
    them in ~1 ms and a reply walks ^[a-z]{6000}$ whole (its states: 1 a character, ``.``'s 9)."""
    r = _post(capped_gateway, **_format(schema))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


@pytest.mark.parametrize(
    "schema, what",
    [
        ({"type": "string", "minLength": 20_000}, "minLength 20,000: "),
        ({"type": "string", "pattern": "^.{20000}$"}, "a regular expression counting 20,000 repeats"),
        ({"type": "object", "patternProperties": {"^a{1,30000}$": {}}}, "a regular expression counting 30,000 "),
    ],
    ids=["min_length", "pattern", "pattern_name"],
)
def test_a_count_past_the_lexer_is_refused_at_admission(capped_gateway, schema, what):
    r = _post(capped_gateway, **_format(schema))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and f"too big: {what}" in error["message"], error


def test_a_max_length_past_the_lexer_is_clamped_to_it(capped_gateway):
    """Let through, and a string as long as the clamp is written whole, one longer refused where the
    clamp ends it (it was let on until the lexer failed, a few thousand characters on)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 100_000}}, "required": ["s"]}
    r = _post(capped_gateway, **_format(schema))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert _written(schema, {"s": "a" * MOST_COUNTED_CHARS})
    assert not _written(schema, {"s": "a" * (MOST_COUNTED_CHARS + 1)})
    for counted in ({"minLength": MOST_COUNTED_CHARS}, {"pattern": f"^.{{{MOST_COUNTED_CHARS}}}$"}):
        r = _post(capped_gateway, **_format({"type": "string", **counted}))
        assert r.json()["error"]["code"] == "context_length_exceeded", r.text


def _strings(*counts: dict) -> dict:
    properties = {f"s{i}": {"type": "string", **counted} for i, counted in enumerate(counts)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def _two_tools(first: dict, second: dict) -> dict:
    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in (("f", first), ("g", second))]
    return {"tools": tools, "tool_choice": "required"}


@pytest.mark.parametrize(
    "body, param",
    [
        (_format(_strings({"minLength": 3000}, {"minLength": 2900})), "response_format"),
        (_format(_strings({"pattern": "^.{3000}$"}, {"pattern": "^.{2900}$"})), "response_format"),
        (_format(_strings({"pattern": "^(.{100}){60}$"})), "response_format"),
        (_two_tools(_strings({"minLength": 3000}), _strings({"minLength": 2900})), "tools"),
    ],
    ids=["min_lengths", "patterns", "nested", "tools"],
)
def test_counts_past_the_lexer_together_are_refused_at_admission(capped_gateway, body, param):
    """Each under a lexeme's bound, they were let through, and every reply writing them failed
    ~5,560 bytes in (llguidance's lexer: "too many states"): a 400 after a 200 stream began."""
    r = _post(capped_gateway, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"at most {MOST_COUNTED_CHARS:,}" in error["message"], error


HUGE = "9" * 4400  # digits: past the 4,300 Python reads or writes as a number


@pytest.mark.parametrize(
    "pattern",
    ["^a{" + HUGE + "}$", "(" * 44 + "a" + ("){" + HUGE[:100] + "}") * 44],
    ids=["count", "counts_multiplied"],
)
@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_a_count_of_thousands_of_digits_is_refused_with_a_400(capped_gateway, pattern, where):
    """Its count was read with int() (past 4,300 digits: ValueError), or written with its digits'
    commas (counts multiplied): the gateway answered 500."""
    string = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    r = _post(capped_gateway, **(_format(string) if where == "response_format" else _forced(string)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == where and "regular expression counting 1,000,000,000,000 or more" in error["message"], (
        error
    )
