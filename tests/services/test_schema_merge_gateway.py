"""Schemas the size check merges as llguidance does (dayzero.chat.schema_merge), through the real
gateway: a circular $ref with siblings is named as such, and a merge that would read past its bound
is refused (400 naming response_format) without reading on."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app

from .conftest import chat


@pytest.fixture(scope="module")
def gateway(demo_dir, redis_url):
    with TestClient(make_app(Settings(checkpoint=demo_dir, redis_url=redis_url))) as client:
        yield client


def _refused(gateway, schema: dict) -> str:
    body = chat("hi", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    r = gateway.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "response_format"), error
    return error["message"]


def test_a_ref_with_siblings_within_its_own_definition_is_refused_as_circular(gateway):
    """A linked list whose "next" is a $ref to its node with a sibling keyword: the walk took the
    node's copy within itself to the node limit, and the 400 said "more than 3,000 subschemas ...
    DAYZERO_GUIDED_MAX_SCHEMA_NODES", which no limit could ever pass (llguidance: circular references
    with sibling keys are not supported)."""
    node = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/node", "type": "object"}},
    }
    message = _refused(
        gateway, {"type": "object", "properties": {"head": {"$ref": "#/$defs/node"}}, "$defs": {"node": node}}
    )
    assert message.endswith("circular references with sibling keys"), message
    assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES" not in message


def test_a_merge_of_many_copies_of_a_long_list_is_refused_by_what_it_reads(gateway):
    """An allOf of 900 $refs to a definition requiring 10,000 names: the merge rebuilt the list at
    each (1.2 s), accepted it, and llguidance's compile check took 13.7 s more (50 s in all here,
    then the prompt's length refused it)."""
    required = {"required": [f"n{i}" for i in range(10_000)]}
    message = _refused(gateway, {"allOf": [{"$ref": "#/$defs/r"}] * 900, "$defs": {"r": required}})
    assert message.endswith("at most DAYZERO_GUIDED_MAX_SCHEMA_NODES=3000 can be enforced"), message
