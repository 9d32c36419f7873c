"""A reply under a schema in OpenAPI's dialect, through the real stack (the random demo checkpoint,
constrained decoding): a ``nullable`` field whose enum allows only null is written null (was: refused,
"nothing satisfies it"), a string of a format llguidance does not know is written as any string
(was: refused whole, "Unknown format: uri-reference")."""

from __future__ import annotations

import json

from .chat_requests import SEEDS, ask, many

SCHEMA = {
    "type": "object",
    "properties": {
        "gone": {"type": "integer", "nullable": True, "enum": [None]},
        "link": {"type": "string", "format": "uri-reference", "maxLength": 8},
    },
    "required": ["gone", "link"],
    "additionalProperties": False,
}


def test_openapi_schemas_are_enforced_in_a_reply(stack):
    fmt = {"type": "json_schema", "json_schema": {"name": "openapi", "schema": SCHEMA}}
    for choice in many(stack, [ask("Which?", response_format=fmt, temperature=1.0, seed=s) for s in SEEDS[:4]]):
        assert choice["finish_reason"] == "stop", choice
        reply = json.loads(choice["message"]["content"])
        assert reply["gone"] is None and isinstance(reply["link"], str) and len(reply["link"]) <= 8, reply
