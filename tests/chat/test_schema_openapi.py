"""OpenAPI's dialect rewritten for llguidance (dayzero.chat.schema_openapi.as_llguidance): only
where a schema keyword (or a $ref) puts a schema; the client's data under other keys as written."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_openapi import as_llguidance

OPENAPI = {"nullable": True, "type": "string", "format": "int64", "maxLength": 100_000}  # each rewritten in a schema


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "dependentRequired": {"nullable": ["a"], "format": ["b"]}},
        {"type": "object", "dependencies": {"nullable": ["a"]}},
        {"oneOf": [], "discriminator": {"propertyName": "k", "mapping": {"nullable": "#/$defs/a"}}},
        {"type": "string", "x-meta": OPENAPI},  # an extension keyword's value
        {"type": "object", "example": OPENAPI},  # OpenAPI's own example (one, not JSON schema's examples)
        {"type": "object", "properties": {"nullable": {"type": "boolean"}}, "required": ["nullable"]},
        {"enum": [OPENAPI]},
        {"$defs": {"nullable": {"type": "integer"}}, "$ref": "#/$defs/nullable"},
    ],
    ids=["dependent_required", "dependencies", "mapping", "extension", "example", "named", "enum", "defined"],
)
def test_the_clients_data_is_left_as_written(schema):
    """The names and values under keys that hold no schema were rewritten as if they did: an entry
    named "nullable" dropped from dependentRequired, an extension's or an example's "format" dropped."""
    assert as_llguidance(schema) == schema


NULL_STRING = {"type": ["string", "null"], "maxLength": 4_000}


@pytest.mark.parametrize(
    "schema, rewritten",
    [
        ({"properties": {"nullable": OPENAPI}}, {"properties": {"nullable": NULL_STRING}}),
        ({"dependencies": {"a": OPENAPI}}, {"dependencies": {"a": NULL_STRING}}),
        ({"items": [OPENAPI]}, {"items": [NULL_STRING]}),
        (
            {"$ref": "#/components/schemas/X", "components": {"schemas": {"X": OPENAPI}}},
            {"$ref": "#/components/schemas/X", "components": {"schemas": {"X": NULL_STRING}}},
        ),
        (
            {"$ref": "#/x-defs/a~1b%20c", "x-defs": {"a/b c": OPENAPI}},
            {"$ref": "#/x-defs/a~1b%20c", "x-defs": {"a/b c": NULL_STRING}},
        ),
    ],
    ids=["property", "dependency", "item", "pointed", "escaped_pointer"],
)
def test_each_schema_is_rewritten_where_a_keyword_or_a_ref_puts_it(schema, rewritten):
    assert as_llguidance(schema) == rewritten
