"""Schemas as clients write them (OpenAPI's, pydantic's) through the gateway's real checks: what
llguidance cannot take is refused in our words, not its own (an option of its API the client cannot
set). The gateway in-process on a real Redis, no workers: a request let through is refused for
max_tokens past the context, never queued."""

from __future__ import annotations

import json
import logging

import pytest

from dayzero.chat import schema_openapi
from dayzero.chat.grammar import _byte_grammars, json_grammar
from dayzero.chat.schema_openapi import MOST_WARNED, as_llguidance

from .conftest import CAPPED_CONTEXT as CONTEXT
from .conftest import MODEL


def _post(gateway, schema: dict):
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return _post_body(gateway, {"response_format": response_format})


def _post_body(gateway, body: dict):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    return gateway.post("/v1/chat/completions", json={**chat, **body})


def _let_through(r) -> bool:
    return r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_one_of_it_cannot_tell_apart_is_refused_in_our_words(capped_gateway):
    r = _post(capped_gateway, {"oneOf": [{"type": "integer"}, {"type": "number"}]})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "coerce_one_of" not in message and "write anyOf" in message, message


def _forced(parameters: dict) -> dict:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    return {"tools": [tool], "tool_choice": "required"}


def _written(schema: dict, reply: object) -> bool:
    """Whether ``reply`` is written whole under ``schema``'s grammar (a byte a token)."""
    matcher = _byte_grammars().matcher(json_grammar(schema))
    for byte in json.dumps(reply).encode():
        matcher.consume_token(byte)
    return not matcher.is_error() and matcher.is_accepting()


NULLABLE = {"type": "object", "properties": {"a": {"type": "integer", "nullable": True}}, "required": ["a"]}


def test_a_nullable_field_takes_null(capped_gateway):
    """OpenAPI 3.0's ``nullable``: ignored, a nullable field refused null."""
    assert _let_through(_post(capped_gateway, NULLABLE))
    assert _written(NULLABLE, {"a": None}) and _written(NULLABLE, {"a": 3})
    listed = {"type": ["integer", "string"], "nullable": True, "enum": [1, "x"]}  # an enum has to list null (3.0.3)
    assert _written({"type": "integer", "nullable": True, "enum": [1, None]}, None) and not _written(listed, None)


def test_a_nullable_tool_parameter_is_enforced(capped_gateway):
    """A string parameter with ``nullable`` was refused ("string parameters cannot be constrained by
    nullable")."""
    parameters = {"type": "object", "properties": {"s": {"type": "string", "nullable": True}}, "required": ["s"]}
    assert _let_through(_post_body(capped_gateway, _forced(parameters)))


@pytest.mark.parametrize("format_", ["uri-reference", "int64", "byte", "password", "iri"])
def test_a_format_llguidance_does_not_know_is_ignored(capped_gateway, format_):
    """Refused whole ("Unknown format"): JSON schema has an unknown format an annotation."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": format_}}, "required": ["v"]}
    assert _let_through(_post(capped_gateway, schema)), format_
    assert _written(schema, {"v": "any text"})
    assert _let_through(_post_body(capped_gateway, _forced(schema)))


def test_a_known_format_is_still_enforced():
    schema = {"type": "string", "format": "date"}
    assert _written(schema, "2026-12-06") and not _written(schema, "any text")


def test_unknown_formats_are_warned_about_a_bounded_number_of_times(caplog, monkeypatch):
    """ "Once per format" held 64 in an LRU cache: a schema naming 200 formats of its own logged 200
    warnings on every request."""
    monkeypatch.setattr(schema_openapi, "_WARNED", set(), raising=False)  # (none warned about yet)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "format": f"flood-{i}"} for i in range(200)}}
    with caplog.at_level(logging.WARNING, logger="dayzero.gateway"):
        as_llguidance(schema)
        first = len(caplog.records)
        as_llguidance(schema)
    assert 0 < first <= MOST_WARNED and len(caplog.records) == first, (first, len(caplog.records))


def test_the_gateway_walks_a_schema_seen_again_once(capped_gateway, monkeypatch):
    """Each request's tools and reply schema were walked afresh (128 forced tools: ~30 ms of CPU a
    request, sent again or not)."""
    from dayzero.chat import schema_walks

    walks, walk = [], schema_walks.schema_problem
    monkeypatch.setattr(
        schema_walks, "schema_problem", lambda schema, steps: walks.append(steps) or walk(schema, steps)
    )
    parameters = {"type": "object", "properties": {"seen_again_once": {"type": "integer"}}}
    schema = {"type": "object", "properties": {"seen_again_once": {"type": "string"}}}
    for _ in range(3):
        assert _let_through(_post_body(capped_gateway, _forced(parameters)))
        assert _let_through(_post(capped_gateway, schema))
    assert len(walks) == 2, walks
