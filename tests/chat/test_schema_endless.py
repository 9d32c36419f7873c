"""Schemas no finite value satisfies (dayzero.chat.schema_endless), checked against llguidance: what
is refused fails a reply walked deep enough ("Too many items"), what is let through is written whole."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.grammar import _byte_grammars, grammar_problem, json_grammar, schema_problem
from dayzero.chat.schema_endless import endless_problem

NODE = {"$ref": "#/$defs/node"}
OWN_NULL = {"$id": "https://example.com/own", "$defs": {"node": {"type": "null"}}} | NODE


def _defining(node: dict, top: dict | None = None) -> dict:
    """An object requiring "s", a ``NODE`` defined as ``node``."""
    return (top or {"type": "object", "properties": {"s": NODE}, "required": ["s"]}) | {"$defs": {"node": node}}


def _requiring(kind: str = "object", **more) -> dict:  # a node whose required "c" is itself
    return {"type": kind, "properties": {"c": NODE}, "required": ["c"], **more}


SHORT_PREFIX = {"type": "array", "prefixItems": [{"type": "null"}], "items": NODE, "minItems": 2}
NULL_BY_REF = {"type": "object", "anyOf": [{"$ref": "#/$defs/nul"}, _requiring()]}  # (a branch: null)


def _chained(end: dict, steps: int = 2, kinds: object = "object") -> dict:
    """``NODE`` a union of its ``kinds`` with a branch ruled out or not: a $ref ``steps`` links long
    to ``end``, beside ``_requiring()``."""
    links = {f"l{i}": {"$ref": f"#/$defs/l{i + 1}"} for i in range(steps - 1)} | {f"l{steps - 1}": end}
    node = {"type": kinds, "anyOf": [{"$ref": "#/$defs/l0"}, _requiring()]}
    return _defining(node) | {"$defs": {"node": node, **links}}


ENDLESS = {
    "required_ref": _defining(_requiring()),
    "type_list": _defining(_requiring(["object"])),
    "all_of": _defining({"allOf": [_requiring()]}),
    "every_branch": _defining({"anyOf": [_requiring(), {"$ref": "#/$defs/node"}]}),
    "additional": _defining({"type": "object", "additionalProperties": NODE, "required": ["c"]}),
    "least_items": _defining({"type": "array", "items": NODE, "minItems": 1}),
    # (items past a prefix shorter than minItems are ``items``': its prefix alone was read, let through)
    "items_past_a_short_prefix": _defining(
        _requiring(), {"type": "object", "properties": {"s": SHORT_PREFIX}, "required": ["s"]}
    ),
    # a branch its sibling type rules out (llguidance drops it): n's alone
    "branch_ruled_out": _defining({"type": "object", "anyOf": [{"type": "null"}, _requiring()]}),
    "one_of_ruled_out": _defining({"type": "object", "oneOf": [{"type": ["null", "string"]}, _requiring()]}),
    "ref_branch_ruled_out": _defining(NULL_BY_REF) | {"$defs": {"node": NULL_BY_REF, "nul": {"type": "null"}}},
    # ... behind a $ref to a $ref (the union's pruning followed one step: let through)
    "ref_chain_branch_ruled_out": _chained({"type": "null"}),
    "ref_chain_const_branch_ruled_out": _chained({"const": None}, steps=3),
    "ref_chain_enum_branch_ruled_out": _chained({"enum": [None, 1]}),
    "const_branch_ruled_out": _defining({"type": "object", "anyOf": [{"const": None}, _requiring()]}),
    "enum_branch_ruled_out": _defining({"type": "object", "anyOf": [{"enum": [None, "x", 1]}, _requiring()]}),
    "root": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
}
FINITE = {  # (a schema, a finite value of it)
    "optional": (_defining({"type": "object", "properties": {"c": NODE}}), {"s": {}}),
    "nullable": (_defining(_requiring(["object", "null"])), {"s": None}),
    "openapi_nullable": (_defining(_requiring(nullable=True)), {"s": None}),  # (as_llguidance: type or null)
    "a_branch_out": (_defining({"anyOf": [_requiring(), {"type": "null"}]}), {"s": None}),
    "a_branch_of_its_types": (
        _defining({"type": ["object", "null"], "anyOf": [{"type": "null"}, _requiring()]}),
        {"s": None},
    ),
    "a_branch_openapi_nullable": (
        _defining({"type": "object", "nullable": True, "anyOf": [{"type": "null"}, _requiring()]}),
        {"s": None},
    ),
    "a_const_branch_of_its_types": (
        _defining({"type": ["object", "null"], "anyOf": [{"const": None}, _requiring()]}),
        {"s": None},
    ),
    "an_enum_branch_of_its_types": (
        _defining({"type": "object", "anyOf": [{"enum": [None, {"k": 1}]}, _requiring()]}),
        {"s": {"k": 1}},
    ),
    "a_const_integer_is_a_number": (_defining({"type": "number", "anyOf": [{"const": 2}, _requiring()]}), {"s": 2}),
    "an_integer_is_a_number": (_defining({"type": "number", "anyOf": [{"type": "integer"}, _requiring()]}), {"s": 1}),
    "a_ref_chain_to_its_types": (_chained({"type": "null"}, kinds=["object", "null"]), {"s": None}),
    "a_ref_chain_to_an_object": (_chained({"type": "object"}, steps=3), {"s": {}}),
    "a_prefix_as_long_as_its_least": (
        _defining({"type": "array", "prefixItems": [{}], "items": NODE, "minItems": 1}),
        {"s": [1]},
    ),
    "a_short_prefix_items_any": (_defining({"type": "array", "prefixItems": [NODE], "minItems": 0}), {"s": []}),
    "no_least_items": (_defining({"type": "array", "items": NODE}), {"s": []}),
    "not_required": (_defining(_requiring(), {"type": "object", "properties": {"s": NODE}}), {}),
    "a_pattern_may_hold_it": (
        _defining(
            {"type": "object", "patternProperties": {"^c$": {}}, "additionalProperties": NODE, "required": ["c"]}
        ),
        {"s": {"c": 1}},
    ),
    # its "#/$defs/node" is its own resource's (null), not the document's endless one
    "own_id": (
        _defining(_requiring(), {"type": "object", "properties": {"s": OWN_NULL}, "required": ["s"]}),
        {"s": None},
    ),
}


@pytest.mark.parametrize("schema", ENDLESS.values(), ids=ENDLESS.keys())
def test_a_schema_requiring_itself_without_end_is_refused(schema):
    assert "no finite value satisfies it" in (endless_problem(schema) or "")
    assert "Too many items" in (grammar_problem(json_grammar(schema), _byte_grammars(), steps=2048) or "")


@pytest.mark.parametrize("schema, value", FINITE.values(), ids=FINITE.keys())
def test_a_schema_with_a_finite_value_is_let_through(schema, value):
    assert endless_problem(schema) is None
    matcher = _byte_grammars().matcher(json_grammar(schema))
    for byte in json.dumps(value).encode():
        matcher.consume_token(byte)
    assert not matcher.is_error() and matcher.is_accepting(), matcher.get_error()


@pytest.mark.parametrize("keys", [{"not": {"type": "null"}}, {"if": {"type": "object"}, "then": _requiring()}])
def test_keywords_endless_problem_does_not_read_are_refused_by_llguidance(keys):
    """``not`` and ``if``/``then``/``else`` are not read here (taken as satisfiable): llguidance
    compiles neither, so a schema holding them is refused before (were it to, read them here)."""
    assert "Unimplemented keys" in (schema_problem(_defining(keys)) or "")
