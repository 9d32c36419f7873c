"""Schemas whose admission depended on where a pattern stands, checked against llguidance itself:
a group repeating a run without bound, a repeated group read as any character, the open and the
closed grammar's bound on a count after a repeat without bound, and a pattern the walk of the
whole grammar never reaches (an optional property of an open object)."""

from __future__ import annotations

import pytest

from dayzero.chat.grammar import schema_problem
from dayzero.chat.schema_size import size_problem
from dayzero.chat.schema_splits import MOST_AFTER_UNBOUNDED, MOST_AFTER_UNBOUNDED_CLOSED, counted_after_unbounded

from .lexer_replies import DEFAULTS, fails_mid_reply, strings

_FIFTY = {"type": "string", "pattern": "^(a+){50}$"}


def _admitted(schema: dict) -> str | None:
    """Why the gateway refuses ``schema`` (None: it admits it)."""
    return size_problem([schema], DEFAULTS) or schema_problem(schema)


@pytest.mark.parametrize(
    "regex, run",
    [
        ("^(.{2000}.*){2}$", 2000),  # (the second repeat's count after the first's .*)
        ("^(.{1000}.*.{500}){2}$", 2000),  # (its tail, the next repeat's head, its tail again)
        ("^(b{2000}a*){2}$", 0),  # (the head reads no character of the repeat: b{2000} written whole)
        ("^(.{500}.*){3}$", 1000),  # (past forced calls' bound, within the others)
        ("^(b)*a{2000}$", 0),  # (a repeated group reads its own characters, not any)
        ("^(ab)*(ab){1200}$", 1200),
    ],
)
def test_counted_after_unbounded_across_a_groups_repeats(regex, run):
    assert counted_after_unbounded(regex) == run


def test_a_group_whose_next_repeat_goes_on_a_run_is_refused():
    """Counted 4,000 (within MOST_COUNTED_CHARS), no count after ``.*`` within the group: let through,
    and every reply failed 3,850 bytes in, the second repeat's ``.{2000}`` after the first's ``.*``."""
    schema = {"type": "string", "pattern": "^(.{2000}.*){2}$"}
    assert "after a repeat without bound" in (_admitted(schema) or "")
    assert fails_mid_reply(schema, "a" * 4100)


def test_a_repeated_group_is_read_by_its_own_characters():
    """``(b)*`` was read as any character, the ``a{2000}`` after it refused; llguidance writes it whole."""
    schema = {"type": "string", "pattern": "^(b)*a{2000}$"}
    assert not fails_mid_reply(schema, "b" * 100 + "a" * 2000)
    assert _admitted(schema) is None


def test_a_closed_grammar_takes_a_longer_count_after_a_repeat_without_bound():
    """The bound was an open object's: a closed grammar writes ``.*.{1100}`` whole; beside an
    open object ``.*.{1300}`` fails (1,115 bytes in), refused, the error naming the open object's bound."""
    closed = strings({"pattern": f"^.*.{{{MOST_AFTER_UNBOUNDED_CLOSED}}}$"})
    assert not fails_mid_reply(closed, {"s0": "a" * 1500})
    assert _admitted(closed) is None
    beside_open = strings({"pattern": "^.*.{1300}$"})
    beside_open["properties"]["o"] = {"type": "object"}
    assert fails_mid_reply(beside_open, {"s0": "a" * 1500})
    problem = size_problem([beside_open], DEFAULTS) or ""
    assert f"({MOST_AFTER_UNBOUNDED:,} in a grammar holding an object open to other properties)" in problem


def test_past_the_closed_bound_the_error_names_both():
    closed = strings({"pattern": "^.*.{1600}$"})
    assert fails_mid_reply(closed, {"s0": "a" * 1800})
    problem = size_problem([closed], DEFAULTS) or ""
    most, opened = MOST_AFTER_UNBOUNDED_CLOSED, MOST_AFTER_UNBOUNDED
    assert f"at most {most:,} can be enforced ({opened:,} in a grammar holding an object open" in problem


@pytest.mark.parametrize("where", ["properties", "$ref"])
def test_an_optional_propertys_pattern_the_walk_never_reaches_is_refused(where):
    """The walk wrote a key of its own in the open object, never "x": let through, every reply that
    wrote "x" failed 4 bytes in."""
    value = _FIFTY if where == "properties" else {"$ref": "#/$defs/s"}
    schema = {"type": "object", "properties": {"x": value}, "$defs": {"s": _FIFTY}}
    # (admitted first: the walk of a grammar whose lexer a reply grew fails at its first step)
    assert "the pattern '^(a+){50}$' of an optional property" in (_admitted(schema) or "")
    assert fails_mid_reply(schema, {"x": "a" * 60})


@pytest.mark.parametrize(
    "schema, reply",
    [
        ({"type": "object", "properties": {"x": _FIFTY}, "required": ["x"]}, {"x": "a" * 60}),
        ({"type": "object", "additionalProperties": _FIFTY}, {"k": "a" * 60}),
    ],
    ids=["required", "other_properties"],
)
def test_the_same_pattern_where_llguidance_writes_it_is_admitted(schema, reply):
    assert _admitted(schema) is None
    assert not fails_mid_reply(schema, reply)


def _nested(schema: dict, depth: int) -> dict:
    """``schema`` as the one branch of ``depth`` anyOfs within each other."""
    for _ in range(depth):
        schema = {"anyOf": [schema]}
    return schema


def _links(schema: dict, links: int) -> dict:
    """$defs d0 .. d{links - 1}: each a $ref to the next, the last ``schema``."""
    return {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links - 1)} | {f"d{links - 1}": schema}


@pytest.mark.parametrize(
    "schema, reply",
    [
        ({"type": "object", "properties": {"x": {"type": "array", "items": _FIFTY}}}, {"x": ["a" * 60]}),
        ({"type": "object", "properties": {"x": {"anyOf": [_FIFTY, {"type": "integer"}]}}}, {"x": "a" * 60}),
        ({"type": "object", "patternProperties": {"^x": _FIFTY}}, {"x": "a" * 60}),
        ({"type": "object", "properties": {"x": _nested(_FIFTY, 9)}}, {"x": "a" * 60}),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": _links(_FIFTY, 9)}, {"x": "a" * 60}),
    ],
    ids=["array_items", "anyOf_branch", "patternProperties", "nine_deep", "nine_links"],
)
def test_a_pattern_the_walk_never_reaches_within_an_optional_value_is_refused(schema, reply):
    """Only an optional property's own pattern was walked: as an array's items, a union's branch, or
    a patternProperties' value it was let through, and every reply writing it failed at its first byte;
    so was one nested in 9 unions or at the end of 9 $refs (past a depth of 8 none was read)."""
    assert "the pattern '^(a+){50}$' of an optional property" in (_admitted(schema) or "")  # (first: as above)
    assert fails_mid_reply(schema, reply)


def test_more_patterns_the_walk_never_reaches_than_are_walked_is_refused():
    """Past the 64 walked, the rest were let through (the walk of the whole grammar reaches none):
    64 optional patterns of (a+){2} before an optional (a+){50}, every reply writing it failed."""
    properties = {f"p{i}": {"type": "string", "pattern": f"^b{i}(a+){{2}}$"} for i in range(64)}
    schema = {"type": "object", "properties": {**properties, "x": _FIFTY}}
    assert "more than 64 patterns repeating a group that repeats without bound" in (_admitted(schema) or "")
    assert fails_mid_reply(schema, {"x": "a" * 60})
    assert _admitted({**schema, "properties": properties}) is None  # (64: each walked)


_ANY_ITEMS = [{"type": "array"}, {"type": ["array", "null"], "prefixItems": [{"type": "integer"}]}]


@pytest.mark.parametrize("array", _ANY_ITEMS)
def test_an_array_of_any_items_holds_objects_open_to_other_properties(array):
    """An array without ``items`` holds any value, objects open to other properties too: counted as
    closed, ``.*.{1300}`` beside it was let through, and failed 1,115 bytes in."""
    closed = strings({"pattern": "^.*.{1300}$"})
    schema = {**closed, "properties": {**closed["properties"], "o": array}}
    assert fails_mid_reply(schema, {"s0": "a" * 1500})
    assert "in a grammar holding an object open to other properties" in (size_problem([schema], DEFAULTS) or "")


@pytest.mark.parametrize("pattern", ["^((.{1600}.*)){2}$", "^((?:.{1600}.*)?){2}$"])
def test_a_group_whose_next_repeat_goes_on_a_run_is_refused_nested(pattern):
    """The group's head was read only of its own atoms: nested in another group, ``.{1600}`` its
    head no more, let through, and every reply failed, the second repeat's count after the first's ``.*``."""
    schema = strings({"pattern": pattern})
    assert "after a repeat without bound" in (_admitted(schema) or "")
    assert fails_mid_reply(schema, {"s0": "a" * 3400})


@pytest.mark.parametrize("repeats, written", [(39, True), (40, False), (41, False)])
def test_a_pattern_properties_value_is_walked_behind_a_key_its_name_matches(repeats, written):
    """Walked behind "x0" (an optional property's key), ``(a+){40}`` and ``{41}`` of the value of
    ``^[a-z]{3,}_(foo|bar)$`` were let through; behind a key that name matches (as a reply writes
    it) every reply failed at the value's first byte (behind "x": from 42)."""
    value = {"type": "string", "pattern": f"^(a+){{{repeats}}}$"}
    schema = {"type": "object", "patternProperties": {"^[a-z]{3,}_(foo|bar)$": value}}
    problem = _admitted(schema)  # (first: as above)
    assert (problem is None) is written, problem
    assert written or "of an optional property (of patternProperties' '^[a-z]{3,}_(foo|bar)$')" in problem
    assert fails_mid_reply(schema, {"abc_foo": "a" * (repeats + 5)}) is not written


def test_a_pattern_the_walk_never_reaches_is_walked_beside_the_schemas_literals():
    """Beside an enum of 950 Cyrillic letters (its grammar's lexer tells their bytes apart),
    ``(a+){30}`` behind an open object's optional key was walked in an object of its own and let
    through, and every reply writing it failed at its first byte; walked beside the schema's
    literals it is refused. Behind the key alone (no enum) it is written whole."""
    optional = {"type": "object", "properties": {"b": {"type": "string", "pattern": "^(a+){30}$"}}}
    enum = {"enum": ["".join(chr(c) for c in range(0x400, 0x400 + 950))]}
    schema = {"type": "object", "properties": {"o": optional, "e": enum}}
    assert "the pattern '^(a+){30}$' of an optional property" in (_admitted(schema) or "")
    assert fails_mid_reply(schema, {"o": {"b": "a" * 40}})
    assert _admitted(optional) is None and not fails_mid_reply(optional, {"b": "a" * 40})
