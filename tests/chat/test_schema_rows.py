"""The rows of llguidance's parser a schema's objects fill, counted before anything compiles it
(dayzero.chat.schema_rows, through schema_size's check), each edge checked against llguidance's."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_size import SchemaLimits, size_problem

from .test_schema_size import _object


def _optional(properties: int, **extra) -> dict:
    return {**_object(properties), **extra}


def _parser_takes(schema: dict, reply: object = None) -> bool:
    """Whether llguidance's parser (the gateway's limits) walks ``reply`` (by default one holding
    every property of the object, or of the first branch of an anyOf)."""
    import json

    import llguidance

    from dayzero.chat.grammar import _byte_tokenizer, json_grammar, parser_limits

    if reply is None:
        reply = dict.fromkeys(schema.get("anyOf", [schema])[0]["properties"], 1)
    reply = list(json.dumps(reply).encode())
    matcher = llguidance.LLMatcher(_byte_tokenizer(), json_grammar(schema), log_level=0, limits=parser_limits())
    return matcher.try_consume_tokens(reply) == len(reply) and not matcher.is_error()


@pytest.mark.parametrize(("most", "extra"), [(498, {}), (500, {"additionalProperties": False})])
def test_an_object_of_more_optional_properties_than_the_parser_takes_is_refused_before_its_compile(most, extra):
    """llguidance compiled such an object (~0.5 s), then refused it for its row limit: past 498
    optional properties of an open object, 500 of a closed one (the edge is llguidance's own)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    assert size_problem([_optional(most, **extra)], big) is None
    assert _parser_takes(_optional(most, **extra))
    problem = size_problem([_optional(most + 1, **extra)], big)
    assert problem.startswith(f"an object of {most + 1} optional properties (not in required): at most {most}")
    assert not _parser_takes(_optional(most + 1, **extra))


def test_required_properties_do_not_count_as_optional():
    big = SchemaLimits(3000, 120_000, 10_000)
    schema = _optional(1000, required=[f"p{j}" for j in range(502)] + [{"not": "a name"}])
    assert size_problem([schema], big) is None
    schema["required"] = schema["required"][:501]  # (499 optional, all after a required one)
    assert size_problem([schema], big) is None and _parser_takes(schema)  # (was: refused, 499 optional)


def _leading(optional: int, then: int, prefix: str = "p") -> dict:
    """An object of ``optional`` optional properties, then a required one, then ``then`` optional ones."""
    schema = _object(optional + 1 + then, prefix)
    return {**schema, "required": [f"{prefix}{optional}"]}


def test_an_object_with_a_required_property_counts_the_optional_ones_declared_before_it():
    """With a required property, the row where the object opens offers the optional properties
    declared before the first required one (3 items each, and 1): 666 fit, 667 not (llguidance's
    edge). Those after it are not offered there: 499 of them fit (was: every optional property counted
    as in an object with none required, 4 items each: refused past 498, valid schemas llguidance
    enforces given a 400)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    for schema in (_leading(0, 499), _leading(100, 499), _leading(600, 399), _leading(666, 0)):
        assert size_problem([schema], big) is None and _parser_takes(schema)
    over = _leading(667, 0)
    assert not _parser_takes(over)
    assert size_problem([over], big).startswith("an object of 667 optional properties declared before its first")


@pytest.mark.parametrize(("leading", "most"), [(0, 998), (20, 987)])
def test_the_optional_properties_after_a_required_one_fill_a_row_of_their_own(leading, most):
    """After a required property, its optional followers: 2 items each and 3 (plus those before the
    first required one and 3, when there are some): 998 fit after a required one first, 999 not;
    987 after 20 optional and a required one, 988 not (llguidance's edges)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    fits, over = _leading(leading, most), _leading(leading, most + 1)
    assert size_problem([fits], big) is None and _parser_takes(fits)
    assert not _parser_takes(over)
    problem = size_problem([over], big)
    assert problem.startswith(f"an object of {most + 1} optional properties declared after a required one"), problem


def test_the_optional_properties_between_two_required_ones_fill_a_row_of_their_own():
    """Between two required properties: 2 items each and 1, 2 more when optional ones come before the
    first required one (999 fit with none before it, 998 with 100: llguidance's edges)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    for leading, most in ((0, 999), (100, 998)):
        fits, over = _leading(leading, most + 1), _leading(leading, most + 2)
        for schema in (fits, over):  # (a second required property closes the run)
            schema["required"] = [*schema["required"], list(schema["properties"])[-1]]
        assert size_problem([fits], big) is None and _parser_takes(fits), leading
        assert not _parser_takes(over)
        assert size_problem([over], big).startswith(f"an object of {most + 1:,} optional properties declared after")


def test_the_objects_of_an_any_of_count_their_opening_rows_even_with_no_optional_property():
    """An open object of no properties holds 7 items of the row its union opens in, one led by a required
    property 1: 285 empty objects fit, 286 not; 1,000 led by a required property fit (llguidance's
    counts; was: 0 each, such a union passed the check and llguidance refused it after its compile)."""
    big = SchemaLimits(30_000, 120_000, 10_000)
    empty = {"type": "object", "properties": {}}
    fits, over = {"anyOf": [empty] * 285}, {"anyOf": [empty] * 286}
    assert size_problem([fits], big) is None and _parser_takes(fits)
    assert not _parser_takes(over) and size_problem([over], big).startswith("the objects of one anyOf / oneOf")
    led = {"anyOf": [_leading(0, 0, f"b{i}_") for i in range(1000)]}
    assert size_problem([led], big) is None and _parser_takes(led)


def test_the_objects_of_an_any_of_each_beginning_with_a_required_property_fit():
    """A union of objects each led by a required property (a discriminator) and optional fields after
    it: the row where they open holds their first properties only. 300 of them fit (was: refused, 4
    items per optional field and 7 per object counted: 2,700 of the row's 2,000); 300 led by two optional
    properties each are past it, 7 items each (llguidance's count)."""
    big = SchemaLimits(30_000, 120_000, 10_000)
    led = {"anyOf": [_leading(0, 8, f"b{i}_") for i in range(300)]}
    assert size_problem([led], big) is None and _parser_takes(led)
    over = {"anyOf": [_leading(2, 0, f"b{i}_") for i in range(300)]}
    assert not _parser_takes(over)
    assert size_problem([over], big).startswith("the objects of one anyOf / oneOf hold 600 optional properties")


def test_the_objects_of_an_any_of_count_together():
    """Its branches open in one row: two objects of 249 optional properties passed the check, one at
    a time, and llguidance refused them (after its compile); 248 each fit (the edge is its own)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    fits = {"anyOf": [_object(248, "a"), _object(248, "b")]}
    assert size_problem([fits], big) is None and _parser_takes(fits)
    over = {"anyOf": [_object(249, "a"), _object(249, "b")]}
    assert not _parser_takes(over)
    assert size_problem([over], big).startswith("the objects of one anyOf / oneOf hold 498 optional properties")
    closed = {
        "anyOf": [{**_object(n, prefix), "additionalProperties": False} for n, prefix in ((250, "a"), (249, "b"))]
    }
    assert size_problem([closed], big) is None and _parser_takes(closed)


def _referred(*definitions: dict, **union) -> dict:
    """A union whose branches each refer to a definition of its own (``union``: more keys)."""
    branches = [{"$ref": f"#/$defs/d{i}"} for i in range(len(definitions))]
    return {"anyOf": branches, "$defs": {f"d{i}": d for i, d in enumerate(definitions)}, **union}


def test_the_definitions_a_unions_branches_refer_to_count_in_its_row():
    """Two branches referring to objects of 249 optional properties each passed the check (a $ref was
    not followed), and llguidance refused them once a reply reached the union: a 500 mid-reply through
    the gateway, after its check's first steps took the schema. 248 each fit (llguidance's edge), as
    written in place; a chain of references, a nested union and an allOf of one count as their objects."""
    big = SchemaLimits(3000, 120_000, 10_000)
    fits, over = _referred(_object(248, "a"), _object(248, "b")), _referred(_object(249, "a"), _object(249, "b"))
    assert size_problem([fits], big) is None and _parser_takes(fits, {})
    assert not _parser_takes(over, {})
    assert size_problem([over], big).startswith("the objects of one anyOf / oneOf hold 498 optional properties")
    chained = {**over, "anyOf": [{"$ref": "#/$defs/c"}, {"allOf": [{"$ref": "#/$defs/d1"}]}]}
    chained["$defs"] = {**over["$defs"], "c": {"anyOf": [{"$ref": "#/$defs/d0"}, {"type": "null"}]}}
    assert not _parser_takes(chained, {}) and "hold 498 optional properties" in size_problem([chained], big)
    tool = {"type": "object", "properties": {"pick": {"anyOf": over["anyOf"]}}, "$defs": over["$defs"]}
    assert "hold 498 optional properties" in size_problem([{"type": "object"}, tool], big)  # a tool's: into its own


def test_a_definition_many_branches_refer_to_counts_once():
    """llguidance predicts a definition once however many branches refer to it: 400 references to
    one object fit; the same object written out 400 times does not (182 of them already)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    shared = {"anyOf": [{"$ref": "#/$defs/one"}] * 400, "$defs": {"one": _object(1)}}
    assert size_problem([shared], big) is None and _parser_takes(shared, {})
    written = {"anyOf": [_object(1, f"b{i}_") for i in range(182)]}
    assert not _parser_takes(written, {}) and size_problem([written], big).startswith("the objects of one anyOf")


def test_references_in_a_cycle_are_followed_once():
    """A union referring to itself, definitions referring to each other, a pointer into nothing or
    outside the schema: each followed once, none twice."""
    big = SchemaLimits(3000, 120_000, 10_000)
    selfish = {"anyOf": [{"$ref": "#"}, _object(3), {"$ref": "#/$defs/nowhere"}, {"$ref": "other.json#/a"}]}
    assert size_problem([selfish], big) is None
    loop = _referred({"anyOf": [{"$ref": "#/$defs/d1"}, _object(249, "a")]}, {"anyOf": [{"$ref": "#/$defs/d0"}]})
    loop["$defs"]["d1"]["anyOf"].append(_object(249, "b"))
    assert "hold 498 optional properties" in size_problem([loop], big)


def test_only_what_can_be_an_object_counts_as_one():
    """A schema typed only as a string enforces no object, whatever properties it names (600 were
    refused: a false 400); one typed as an object without properties opens as an empty object (7
    items: 285 fit in a union, 286 not; they counted none and passed); ["object", "null"] is an
    object (llguidance's edges are the same: 498)."""
    big = SchemaLimits(3000, 120_000, 10_000)
    text = {"type": ["string", "null"], "properties": _object(600)["properties"]}
    assert size_problem([text], big) is None and _parser_takes(text, "x")
    fits, over = {"anyOf": [{"type": "object"}] * 285}, {"anyOf": [{"type": "object"}] * 286}
    assert size_problem([fits], big) is None and _parser_takes(fits, {})
    assert not _parser_takes(over, {}) and size_problem([over], big).startswith("the objects of one anyOf")
    nullable = _optional(498, type=["object", "null"])
    assert size_problem([nullable], big) is None and _parser_takes(nullable)
    assert size_problem([_optional(499, type=["null", "object"])], big).startswith("an object of 499 optional")
