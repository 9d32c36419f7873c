"""An enforced schema whose literal spells a special token (``<｜User｜>`` as a property name, a
const or enum string) is refused with 400 before it queues: llguidance offered the special token
itself where the grammar forced those bytes, then refused it, and the reply failed mid-way with 500.
Annotations may spell one. The gateway in-process on a real Redis, no workers: a request let
through is refused for max_tokens past the context, never queued."""

from __future__ import annotations

import pytest

from .conftest import CAPPED_CONTEXT as CONTEXT
from .conftest import MODEL


@pytest.fixture(scope="module")
def gateway(capped_gateway):
    return capped_gateway


def _post(gateway, **body):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, **body})


def _forced(parameters: dict) -> dict:
    return {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": "required",
    }


def _format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


NAMED = {"type": "object", "properties": {"<｜User｜>": {"type": "integer"}}, "required": ["<｜User｜>"]}
# (a tool's parameter name may hold no "<" at all: the reply parser reads none; this one spells the marker)
TOOL_NAMED = {"type": "object", "properties": {"x｜DSML｜y": {"type": "integer"}}, "required": ["x｜DSML｜y"]}


@pytest.mark.parametrize(
    "body, param, token",
    [
        (_forced(TOOL_NAMED), "tools", "｜DSML｜"),
        (
            _forced({"type": "object", "properties": {"a": {"enum": ["x｜DSML｜y"]}}, "required": ["a"]}),
            "tools",
            "｜DSML｜",
        ),
        (_format(NAMED), "response_format", "<｜User｜>"),
        (_format({"const": {"k": ["a</think>"]}}), "response_format", "</think>"),
    ],
    ids=["tool_property", "tool_enum", "format_property", "format_nested_const"],
)
def test_a_literal_spelling_a_special_token_is_refused(gateway, body, param, token):
    r = _post(gateway, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"special token {token}" in error["message"], error


@pytest.mark.parametrize(
    "body",
    [
        _format({"type": "object", "description": "answer after </think>", "properties": {"a": {"type": "integer"}}}),
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": TOOL_NAMED}}]
        },  # auto: shown, not enforced
    ],
    ids=["annotation", "auto"],
)
def test_what_no_grammar_writes_may_spell_one(gateway, body):
    r = _post(gateway, **body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_required_name_spelling_one_is_refused_in_our_words(gateway):
    """A required name that is no property is still written as one: llguidance's parser error
    ("token ... doesn't satisfy the grammar") reached the client."""
    r = _post(gateway, **_format({"type": "object", "required": ["<｜User｜>"]}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and "special token <｜User｜>" in error["message"], error


@pytest.mark.parametrize("defs", ["$defs", "definitions"])
def test_a_definition_nothing_refers_to_may_spell_one(gateway, defs):
    unused = {"type": "object", "properties": {"<｜User｜>": {"type": "integer"}}}
    used = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    schema = {"$ref": f"#/{defs}/used", defs: {"used": used, "unused": unused}}
    r = _post(gateway, **_format(schema))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    referred = {**schema, defs: {"used": {**used, "properties": {"a": {"$ref": f"#/{defs}/unused"}}}, "unused": unused}}
    r = _post(gateway, **_format(referred))  # reached through another definition: refused
    assert r.status_code == 400 and "special token <｜User｜>" in r.json()["error"]["message"], r.text


def test_a_recursive_schema_s_unused_definition_may_spell_one(gateway):
    """A $ref to the root ("#": a tree's children) reaches no definition: one nothing refers to is
    not read (reading every definition for any $ref but "#/$defs/name" would)."""
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    r = _post(gateway, **_format({**tree, "$defs": {"unused": NAMED}}))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


@pytest.mark.parametrize(
    "ref, root",
    [
        ("#/%24defs/bad", {}),  # "$defs" percent-encoded, as a URI fragment may spell it
        ("#bad", {}),  # the definition's $anchor
        ("https://x.test/s#/$defs/bad", {"$id": "https://x.test/s"}),  # the root's $id, absolute
        ("s#/$defs/bad", {"$id": "https://x.test/s"}),  # and relative to it
    ],
    ids=["percent_encoded", "anchor", "absolute_uri", "relative_uri"],
)
def test_a_definition_reached_by_any_spelling_of_its_ref_is_read(gateway, ref, root):
    """llguidance follows each of these $refs to the definition (a reply must write its name), but the
    check read only "#/$defs/name": the schema passed and every reply failed at the name."""
    bad = {**NAMED, "$anchor": "bad"}
    schema = {**root, "type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"], "$defs": {"bad": bad}}
    r = _post(gateway, **_format(schema))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and "special token <｜User｜>" in error["message"], error


FLAGS = {f"b{i}": {"type": "boolean"} for i in range(30)}  # ~420 bytes in: past the check's walk
ONLY_NAMED = {"type": "object", "patternProperties": {"^<｜User｜>$": {}}, "additionalProperties": False}


@pytest.mark.parametrize(
    "value",
    [
        {"type": "string", "pattern": "^<｜User｜>$"},
        {**ONLY_NAMED, "minProperties": 1},
    ],
    ids=["pattern", "pattern_property"],
)
def test_a_regular_expression_spelling_one_is_refused(gateway, value):
    """A reply forced through a regular expression's literal writes it as a name or const would; the
    check read no regular expression: past the walk's bytes it passed, and every reply failed there."""
    schema = {"type": "object", "properties": {**FLAGS, "s": value}, "required": [*FLAGS, "s"]}
    r = _post(gateway, **_format(schema))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format" and "special token <｜User｜>" in error["message"], error
