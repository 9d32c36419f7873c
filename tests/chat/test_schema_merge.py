"""A schema counted as llguidance builds it (dayzero.chat.schema_merge, through schema_size's check):
an allOf, a $ref with sibling keywords and a union with siblings merge copies, which the count as
written missed (and the objects they merge, which the row check missed: every reply failed there)."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.schema_merge import Merged
from dayzero.chat.schema_size import SchemaLimits, _schema_nodes, size_problem

from .test_schema_size import LIMITS, _object

DEFAULTS = SchemaLimits(3000, 120_000, 10_000)
FLAGS = {f"b{i}": {"type": "boolean"} for i in range(4)}


def _late(schema: dict) -> dict:
    """``schema`` as the property "u" after 4 required flags: the gateway's grammar check walks its
    first 8 steps only, so nothing but the count stands between it and a reply that fails there."""
    return {"type": "object", "properties": FLAGS | {"u": schema}, "required": [*FLAGS, "u"]}


def _reply_fails_at_u(schema: dict) -> bool:
    """Whether llguidance's parser (the gateway's limits) fails a reply as it opens "u"'s object."""
    import llguidance

    from dayzero.chat.grammar import JSON_STYLE, _byte_tokenizer, json_grammar, parser_limits

    text = json.dumps(dict.fromkeys(FLAGS, True), separators=(JSON_STYLE["item_separator"], ": "))
    reply = list((text[:-1] + ', "u": {').encode())
    matcher = llguidance.LLMatcher(_byte_tokenizer(), json_grammar(schema), log_level=0, limits=parser_limits())
    return matcher.try_consume_tokens(reply) < len(reply) or matcher.is_error()


def _nodes_refused(problem: str | None) -> bool:
    return problem is not None and "DAYZERO_GUIDED_MAX_SCHEMA_NODES=50" in problem


def test_a_ref_with_sibling_keywords_counts_its_definition_at_each_such_ref():
    """llguidance merges the definition into each such $ref's siblings, a copy each: 10 of them to a
    definition of 10 properties are 110 subschemas built (23 as written). A plain $ref, or one beside
    annotations only (pydantic's description), is the definition once."""
    refs = {f"r{i}": {"$ref": "#/$defs/d", "type": "object"} for i in range(10)}
    schema = {"type": "object", "properties": refs, "$defs": {"d": _object(10)}}
    assert _nodes_refused(size_problem([schema], LIMITS))
    for sibling in ({}, {"description": "the same record", "title": "R"}):
        refs = {f"r{i}": {"$ref": "#/$defs/d", **sibling} for i in range(10)}
        assert size_problem([{**schema, "properties": refs}], LIMITS) is None


def test_an_allof_of_unions_counts_every_combination_of_their_branches():
    """llguidance intersects each branch of one with each of the others: 3 unions of 4 branches are
    64 merged objects (17 subschemas as written); 6 of 6, 46,656, are refused without building them."""

    def unions(count: int, branches: int) -> dict:
        one = [{"type": "object", "properties": {f"k{j}": {"type": "integer"}}} for j in range(branches)]
        return {"allOf": [{"anyOf": one} for _ in range(count)]}

    assert _nodes_refused(size_problem([unions(3, 4)], LIMITS))
    assert size_problem([unions(2, 3)], LIMITS) is None
    assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES=3000" in size_problem([unions(6, 6)], DEFAULTS)


def test_a_union_with_sibling_keywords_counts_them_in_each_branch():
    """One of several fields required: the object's 20 properties are merged into each of the 5
    branches (llguidance builds 5 objects of 20)."""
    one_of = [{"required": [f"p{j}"]} for j in range(5)]
    assert _nodes_refused(size_problem([{**_object(20), "anyOf": one_of}], LIMITS))
    assert size_problem([{**_object(20), "anyOf": one_of}], DEFAULTS) is None


def _merged_halves(kind: str, half: int, prefix: str) -> tuple[dict, dict]:
    """A schema merging two objects of ``half`` optional properties: an allOf of both, or a $ref to
    one with the other's properties beside it; and its definitions."""
    first, second = _object(half, f"{prefix}x"), _object(half, f"{prefix}y")
    if kind == "allOf":
        return {"allOf": [first, second]}, {}
    return {"$ref": f"#/$defs/{prefix}", "properties": second["properties"]}, {prefix: first}


@pytest.mark.parametrize("kind", ["allOf", "$ref with siblings"])
def test_objects_merged_past_a_row_of_the_parser_are_refused_in_a_union_or_alone(kind):
    """Each branch merges two objects of 200 optional properties (400 each; 3,214 items of a row, as
    llguidance counts them): written, no object held more than 200 (400 in the union, 1,614 items)
    and the count let them through, and every reply failed as it reached them. Alone, a merged
    object of 250 and 250 is past 498."""
    branches, definitions = zip(*(_merged_halves(kind, 200, f"d{i}") for i in range(2)), strict=True)
    union = _late({"anyOf": list(branches)}) | {"$defs": {k: v for d in definitions for k, v in d.items()}}
    problem = size_problem([union], DEFAULTS)
    assert problem.startswith("the objects of one anyOf / oneOf hold 800 optional properties that may come first")
    assert "3,214 items of its 2,000" in problem
    assert _reply_fails_at_u(union)
    merged, definitions = _merged_halves(kind, 250, "d")
    alone = _late(merged) | {"$defs": definitions}
    assert size_problem([alone], DEFAULTS).startswith("an object of 500 optional properties (not in required)")
    assert _reply_fails_at_u(alone)
    merged, definitions = _merged_halves(kind, 100, "d")  # 200: within the row, llguidance's too
    assert size_problem([_late(merged) | {"$defs": definitions}], DEFAULTS) is None
    assert not _reply_fails_at_u(_late(merged) | {"$defs": definitions})


def test_pattern_properties_fill_the_row_of_the_object_they_are_in():
    """Each name of patternProperties is an item of the row (450 optional properties and 400
    patterns: 2,207 items, llguidance's count): 474 optional and 100 patterns are 2,003, past it;
    473, 1,999, fit (written, 474 made 1,903)."""
    named = {f"^q{j}$": {"type": "integer"} for j in range(100)}
    schema = _object(474) | {"patternProperties": named}
    problem = size_problem([_late(schema)], DEFAULTS)
    assert problem.startswith("an object of 474 optional properties (not in required): at most 473 in one object")
    assert "100 patternProperties" in problem and _reply_fails_at_u(_late(schema))
    schema = _object(473) | {"patternProperties": named}
    assert size_problem([_late(schema)], DEFAULTS) is None and not _reply_fails_at_u(_late(schema))


def test_an_object_of_more_than_100_pattern_properties_is_refused_whatever_their_length():
    """400 names of 5 characters (2,000 of the 10,000 the pattern limit allows) compiled for 25-63 s."""
    named = {f"^q{j}$": {"type": "integer"} for j in range(101)}
    problem = size_problem([{"type": "object", "patternProperties": named}], DEFAULTS)
    assert problem == "an object of 101 patternProperties: at most 100 in one can be enforced"
    del named["^q100$"]
    assert size_problem([{"type": "object", "patternProperties": named}], DEFAULTS) is None


def test_merges_nested_past_a_hundred_are_refused_without_recursing_on():
    schema: dict = {"type": "integer"}
    for _ in range(5_000):
        schema = {"allOf": [schema, {"minimum": 0}]}
    assert "merged within each other over 100 deep" in size_problem([schema], DEFAULTS)
    unions: dict = {"type": "integer"}
    for _ in range(5_000):  # unions in unions, merged with an object's siblings
        unions = {"anyOf": [unions, {"type": "string"}]}
    assert "over 100 deep" in size_problem([{"allOf": [unions, {"type": "object"}]}], DEFAULTS)


def test_pydantic_style_schemas_count_as_written():
    """$refs beside a description, Optional fields (anyOf [$ref, null] with a default), an allOf of
    one: nothing copied (annotations merge nothing), counted as written (the allOf of one as its
    member)."""
    address = {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}
    fields = {
        "home": {"$ref": "#/$defs/Address", "description": "where they live"},
        "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None, "title": "Work"},
        "billing": {"allOf": [{"$ref": "#/$defs/Address"}], "description": "billing address"},
    }
    schema = {"type": "object", "properties": fields, "required": ["home"], "$defs": {"Address": address}}
    written = sum(1 for _ in _schema_nodes([schema]))  # (as the count had it)
    assert sum(1 for _ in _schema_nodes([schema], Merged(3000))) == written - 1  # (the allOf of one: its member)
    assert size_problem([schema], SchemaLimits(written - 1, 500, 100)) is None
    assert size_problem([schema], SchemaLimits(written - 2, 500, 100)) is not None


def test_a_forced_tools_value_rule_carries_only_the_definitions_it_needs():
    """Each value's rule is a JSON schema of its own with its copy of the definitions: every one in
    each made a tool of 1,000 properties and 1,000 defined ones a 37 MB grammar (~0.9 GB, seconds
    of the gateway's compile before llguidance refused it); the size check counts each copy."""
    from dayzero.chat.call_parameters import value_definitions

    defs = {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}}, "b": {"type": "integer"}}
    parameters = {"type": "object", "properties": {}, "$defs": defs | {"c": _object(40)}}
    assert value_definitions({"$ref": "#/$defs/a"}, parameters) == {"$defs": {"a": defs["a"], "b": defs["b"]}}
    assert value_definitions({"type": "integer"}, parameters) == {}
    assert value_definitions({"$ref": "#/definitions/a"}, parameters) == {}  # (none there)


def test_a_merge_reading_past_its_bound_is_refused_without_reading_on():
    """Copies share what they copy, so the intersections' bound did not bound what merges read: an
    allOf of 900 $refs to a definition requiring 10,000 names rebuilt the list 900 times (1.2 s, then
    accepted); 3,000 $refs to one of 10,000 prefixItems (40 kB) took 30 s. Each refused, reading
    ``MOST_READ_PER_NODE`` items per subschema allowed at most (0.02-0.1 s)."""
    required = {"required": [f"n{i}" for i in range(10_000)]}
    problem = size_problem([{"allOf": [{"$ref": "#/$defs/r"}] * 900, "$defs": {"r": required}}], DEFAULTS)
    assert problem is not None and "DAYZERO_GUIDED_MAX_SCHEMA_NODES=3000" in problem
    few = {"required": [f"n{i}" for i in range(20)]}  # (a definition of 20 names merged 100 times: read 4,000)
    assert size_problem([{"allOf": [{"$ref": "#/$defs/r"}] * 100, "$defs": {"r": few}}], DEFAULTS) is None


def test_a_ref_indexing_a_list_by_thousands_of_digits_is_no_error():
    """Python reads no int of over 4,300 digits: a $ref "#/allOf/111...1" (5,000 digits) with a
    sibling was a ValueError (a 500); it points at nothing, as llguidance finds."""
    ref = "#/allOf/" + "1" * 5000
    schema = {"type": "object", "allOf": [{"type": "object"}], "properties": {"a": {"$ref": ref, "minLength": 1}}}
    assert size_problem([schema], LIMITS) is None
