"""Schemas as clients write them (OpenAPI's, pydantic's) through the gateway's real checks: what
llguidance cannot take is refused in our words, not its own (an option of its API the client cannot
set). The gateway in-process on a real Redis, no workers: a request let through is refused for
max_tokens past the context, never queued."""

from __future__ import annotations

from .conftest import CAPPED_CONTEXT as CONTEXT
from .conftest import MODEL


def _post(gateway, schema: dict):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": CONTEXT}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return gateway.post("/v1/chat/completions", json={**chat, "response_format": response_format})


def _let_through(r) -> bool:
    return r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_one_of_it_cannot_tell_apart_is_refused_in_our_words(capped_gateway):
    r = _post(capped_gateway, {"oneOf": [{"type": "integer"}, {"type": "number"}]})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "coerce_one_of" not in message and "write anyOf" in message, message
