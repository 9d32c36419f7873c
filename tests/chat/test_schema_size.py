"""A schema's size, measured before anything compiles it (dayzero.chat.schema_size)."""

from __future__ import annotations

from dayzero.chat.schema_size import SchemaLimits, size_problem

LIMITS = SchemaLimits(nodes=50, literal_chars=500, pattern_chars=100)


def _object(properties: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{j}": {"type": "integer"} for j in range(properties)}}


def test_a_definition_is_counted_once_however_many_refs_point_at_it():
    """Written: a definition of 40 properties and 4 references to it (45 subschemas and the root);
    expanded, it would be 160 properties. A recursive definition costs its size too."""
    schema = {
        "type": "object",
        "properties": {f"r{j}": {"$ref": "#/$defs/d"} for j in range(4)},
        "$defs": {"d": _object(40)},
    }
    assert size_problem([schema], LIMITS) is None
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array"}}}}}
    tree["$defs"]["node"]["properties"]["kids"]["items"] = {"$ref": "#/$defs/node"}
    assert size_problem([tree], LIMITS) is None


def test_schemas_are_counted_together_and_the_message_names_the_limit_and_its_setting():
    assert size_problem([_object(30)], LIMITS) is None
    problem = size_problem([_object(30, "a"), _object(30, "b")], LIMITS)
    assert problem == (
        "more than 50 subschemas (properties, items, branches, definitions): "
        "at most DAYZERO_GUIDED_MAX_SCHEMA_NODES=50 can be enforced"
    )


def test_a_property_named_as_a_data_keyword_is_still_a_schema():
    """Under ``properties`` the names are the client's: one called "enum" holds a schema, counted."""
    schema = {"type": "object", "properties": {"enum": _object(60), "const": {"type": "string"}}}
    assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES=50" in size_problem([schema], LIMITS)


def test_literals_and_patterns_are_bounded_by_their_characters():
    assert size_problem([{"enum": ["a" * 100] * 5}], LIMITS) is None
    assert "DAYZERO_GUIDED_MAX_LITERAL_CHARS=500" in size_problem([{"enum": ["a" * 100] * 5 + ["b"]}], LIMITS)
    assert "DAYZERO_GUIDED_MAX_LITERAL_CHARS=500" in size_problem([{"const": {"k": "v" * 500}}], LIMITS)
    many = [{"enum": [{"n": j} for j in range(100)]}]  # data, not subschemas: its characters count
    assert "DAYZERO_GUIDED_MAX_LITERAL_CHARS" in size_problem(many, LIMITS)
    assert size_problem([{"type": "string", "pattern": "a" * 100}], LIMITS) is None
    named = {"type": "object", "patternProperties": {"^x" + "a" * 60: {}, "^y" + "b" * 60: {}}}
    assert "DAYZERO_GUIDED_MAX_PATTERN_CHARS=100" in size_problem([named], LIMITS)


def test_a_deep_schema_is_walked_without_recursion():
    schema: dict = {"type": "string"}
    for _ in range(100_000):
        schema = {"type": "array", "items": schema}
    assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES" in size_problem([schema], SchemaLimits(3000, 120_000, 10_000))


def test_required_names_not_among_the_properties_are_counted_as_properties():
    """llguidance builds each as a property of its own: 100,000 of them (~1 MB, within the body's
    limit) were no subschemas to the count, and took 62 s of the gateway's compile to be refused."""
    defaults, names = SchemaLimits(3000, 120_000, 10_000), [f"r{i}" for i in range(100_000)]
    for many in (names, names[:3000]):  # (the object and 3,000 properties: one past the limit)
        assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES=3000" in size_problem([{"type": "object", "required": many}], defaults)
    assert size_problem([{"type": "object", "required": names[:2999]}], defaults) is None
    declared = _object(40) | {"required": [f"p{j}" for j in range(40)] * 2}  # declared, or repeated: counted once
    assert size_problem([declared], LIMITS) is None


def test_client_data_beside_a_schema_counts_as_no_subschema():
    """An OpenAPI ``example``, an ``x-`` extension, a ``default`` hold the client's data, which
    llguidance compiles nowhere (it takes such a schema whole): a ``{"minLength": 5000}`` or 60
    objects there were refused as subschemas."""
    data = {"minLength": 5000, "items": [_object(0) for _ in range(60)]}
    for key in ("example", "x-meta", "default"):
        schema = {"type": "object", "properties": {"a": {"type": "string", key: data}}, key: data}
        assert size_problem([schema], LIMITS) is None, key


def test_data_a_ref_points_at_is_counted_as_the_schema_it_becomes():
    """llguidance follows a JSON pointer anywhere (after the root's $id too): there data is a schema."""
    for ref in ("#/x-defs/long", "https://example.com/s#/x-defs/long", "#/properties/a/example"):
        schema = {"$id": "https://example.com/s", "x-defs": {"long": {"type": "string", "minLength": 5000}}}
        schema |= {"type": "object", "properties": {"a": {"example": {"minLength": 5000}}, "b": {"$ref": ref}}}
        assert "minLength 5,000" in size_problem([schema], LIMITS), ref
    wide = {"type": "object", "x-defs": {"wide": _object(60)}, "properties": {"a": {"$ref": "#/x-defs/wide"}}}
    assert "DAYZERO_GUIDED_MAX_SCHEMA_NODES=50" in size_problem([wide], LIMITS)


def test_data_a_ref_points_at_after_a_definitions_id_is_counted():
    """llguidance resolves a pointer against the nearest $id: a definition's own ("#/x-big" within
    it, or its URI's "https://example.com/inner#/x-big"), not the root's. Refs into a definition's data
    so were let through (a reply of the minLength of 6,000 failed 5,559 bytes in, past the lexer)."""
    inner = {"$id": "https://example.com/inner", "x-big": {"type": "string", "minLength": 6000}}
    for ref in ("https://example.com/inner#/x-big", "inner#/x-big"):
        schema = {"$id": "https://example.com/s", "type": "object", "properties": {"a": {"$ref": ref}}}
        assert "minLength 6,000" in size_problem([schema | {"$defs": {"inner": inner}}], LIMITS), ref
    within = inner | {"type": "object", "properties": {"a": {"$ref": "#/x-big"}}}
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/inner"}}, "$defs": {"inner": within}}
    assert "minLength 6,000" in size_problem([schema], LIMITS)


ROOMY = SchemaLimits(nodes=3000, literal_chars=120_000, pattern_chars=10_000)  # the settings' defaults


def _named(name: str) -> dict:
    return {"type": "object", "properties": {name: {"type": "integer"}}}


def test_one_literal_is_bounded_by_the_bytes_a_reply_writes():
    """llguidance's lexer pays at each decode step for every byte of a literal still to write (one
    row's mask: ~0.22 ms per 1,000 bytes, bench/literal_steps.py): 10,000 characters were let
    through (~2.2 ms a step at its start), 10,000 CJK ones (30,000 bytes: ~6 ms) too. At most
    4,000 bytes (~0.9 ms), as UTF-8 and JSON-escaped as the reply writes them."""
    assert size_problem([{"const": "c" * 4000}, _named("n" * 4000)], ROOMY) is None
    assert size_problem([{"type": "string", "pattern": "p" * 4000}], ROOMY) is None
    refused = {
        "an enum or const string of 4,001 bytes": {"const": "c" * 4001},
        "an enum or const string of 4,200 bytes": {"enum": ["a", "数" * 1400]},  # 3 bytes a character
        "an enum or const string of 4,002 bytes": {"const": {"k": ['"' * 2001]}},  # written \"
        "a property name of 4,001 bytes": _named("n" * 4001),
        "a regular expression of 4,002 bytes": {"type": "string", "pattern": "é" * 2001},
    }
    for what, schema in refused.items():
        assert what in (size_problem([schema], ROOMY) or ""), (what, size_problem([schema], ROOMY))


def test_an_enum_or_const_value_that_is_no_string_is_bounded_whole():
    """llguidance spells a const (or an enum's value) that is an array or object as one literal, its
    whole JSON text: ten strings of 3,990 bytes each, every one within the bound, cost ~11-16 ms a
    step (bench/literal_steps.py's measure: 0.9 at 4,000 bytes) and were let through."""
    assert size_problem([{"const": ["x" * 3996]}], ROOMY) is None  # ["x...x"]: 4,000 bytes
    assert "an enum or const value (its JSON text) of 4,001 bytes" in size_problem([{"const": ["x" * 3997]}], ROOMY)
    refused = {  # (JSON as DeepSeek writes it: ", " and ": ")
        "39,940": {"const": ["x" * 3990] * 10},
        "40,000": {"enum": [1, {f"k{i}": "x" * 3990 for i in range(10)}]},
    }
    for written, schema in refused.items():
        assert f"an enum or const value (its JSON text) of {written} bytes" in (size_problem([schema], ROOMY) or "")
