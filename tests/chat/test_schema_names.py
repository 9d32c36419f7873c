"""patternProperties' names as llguidance's compile pays for them (``schema_names``): each pair is
checked for an overlap, so the names times their bytes are bounded, in the schema and in the walk
of the patterns the schema's own walk never reaches (``schema_unreached``)."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.grammar import _byte_grammars, json_grammar, schema_problem
from dayzero.chat.schema_names import MOST_PAIR_BYTES, pair_bytes
from dayzero.chat.schema_size import size_problem
from dayzero.chat.schema_unreached import _walks, unreached_patterns

from .lexer_replies import DEFAULTS


def _names(count: int, shared: int) -> list[str]:
    """``count`` names of ``shared`` + 4 bytes, told apart only at their end (every pair's whole read)."""
    return [f"^{'a' * shared}{i:02d}$" for i in range(count)]


def _value(i: int, repeats: int = 2) -> dict:
    return {"type": "string", "pattern": f"^(a+){{{repeats}}}b{i}$"}


def _fails_behind(schema: dict, prefix: str) -> bool:
    """Whether llguidance's lexer fails computing the mask after writing ``prefix`` a byte a step."""
    matcher = _byte_grammars().matcher(json_grammar(schema))
    for byte in prefix.encode():
        matcher.compute_logit_bias()
        matcher.consume_token(byte)
    matcher.compute_logit_bias()
    return matcher.is_error() and "too many" in matcher.get_error()


def test_long_names_past_the_pairs_bound_are_refused_naming_it():
    """64 names of 144 bytes (within the 10,000 characters of patterns and the 100 names): each
    pair read, 63 x 9,216 = 580,608 bytes (schema_problem: 0.7 s of CPU idle, 7.2 s at load ~14);
    refused before any compile, naming the bound. 32 of 104 bytes (31 x 3,328 = 103,168) too;
    31 of them (30 x 3,224 = 96,720) admitted, and llguidance compiles them."""
    many = {"type": "object", "patternProperties": {name: _value(i) for i, name in enumerate(_names(64, 140))}}
    problem = size_problem([many], DEFAULTS) or ""
    assert "580,608 bytes read" in problem and f"at most {MOST_PAIR_BYTES:,}" in problem, problem
    past = {"type": "object", "patternProperties": {name: _value(i) for i, name in enumerate(_names(32, 100))}}
    assert "103,168 bytes read" in (size_problem([past], DEFAULTS) or "")
    within = {"type": "object", "patternProperties": {name: _value(i) for i, name in enumerate(_names(31, 100))}}
    assert size_problem([within], DEFAULTS) is None
    assert not _byte_grammars().matcher(json_grammar(within)).is_error()
    assert schema_problem(within) is None


def test_the_walk_of_names_in_many_objects_holds_each_object_within_the_bound():
    """64 objects of one long name each pass the schema's bound (each object one name), but the walk
    of the patterns it never reaches held all 64 names in one object (580,608 bytes read by its
    compile); each walked object now holds names within the bound, and a pattern failing behind the
    last name's key is still found, as llguidance fails a reply there."""
    names = _names(64, 140)
    values = [_value(i, 60 if i == 63 else 2) for i in range(64)]
    objects = {f"o{i}": {"type": "object", "patternProperties": {name: values[i]}} for i, name in enumerate(names)}
    schema = {"type": "object", "properties": objects}
    assert size_problem([schema], DEFAULTS) is None
    walks = _walks(tuple(unreached_patterns(schema)))
    read = [(len(walk["patternProperties"]) - 1) * sum(map(len, walk["patternProperties"])) for walk, _ in walks]
    assert len(walks) > 1 and max(read) <= MOST_PAIR_BYTES, read
    assert sum(len(walk["patternProperties"]) for walk, _ in walks) == 64
    assert names[63] in (schema_problem(schema) or "")
    assert _fails_behind(schema, '{"o63": ' + json.dumps({names[63][1:-1]: ""})[:-2])


def test_a_name_walked_apart_is_walked_beside_the_other_objects_names():
    """50 names of 19 Cyrillic letters (98,000 bytes read by their pairs: within the bound) in one
    object and ``^b$`` in another: walked apart (one object of the 51 read past it), ``(a+){30}`` behind
    "b" alone was written whole (so to 40), but the schema's grammar tells the Cyrillic names' bytes
    apart and llguidance fails every reply there; walked beside the others' names, it is refused."""
    letters = [chr(0x400 + c) for c in range(50 * 19)]
    names = ["^" + "".join(letters[19 * i : 19 * (i + 1)]) + "$" for i in range(50)]
    wide = {"type": "object", "patternProperties": {name: _value(i) for i, name in enumerate(names)}}
    short = {"type": "object", "patternProperties": {"^b$": {"type": "string", "pattern": "^(a+){30}$"}}}
    schema = {"type": "object", "properties": {"b": short, "w": wide}}
    walks = _walks(tuple(unreached_patterns(schema)))
    assert [list(walk["patternProperties"]) for walk, _ in walks][-1] == ["^b$"]  # (walked apart)
    assert size_problem([schema], DEFAULTS) is None
    assert "^(a+){30}$" in (schema_problem(schema) or "")
    assert _fails_behind(schema, '{"b": {"b": "')


@pytest.mark.parametrize(
    "name, count, read",
    [("^.{{12}}x{:02d}$", 99, 98 * 99 * 12 * 9), ("^.....x{:02d}$", 99, 98 * 99 * (10 + 5 * 8))],
    ids=["counted_dots", "dots"],
)
def test_names_of_any_characters_weigh_their_states_not_their_bytes(name, count, read):
    """99 names of 10 bytes (97,020 read by the bytes: admitted) cost schema_problem 1.08 s of CPU for
    ``^.{12}x00$`` and 0.41 s for ``^.....x00$``, more than the 64 names of 144 bytes refused (0.29 s):
    a "." is any UTF-8 character, 9 states, counted or not. Refused now, the weight hand-computed; names
    of 144 bytes spelled out, or of ``\\.`` and ``[.]``, still weigh their bytes."""
    names = {name.format(i): {"type": "integer"} for i in range(count)}
    problem = size_problem([{"type": "object", "patternProperties": names}], DEFAULTS) or ""
    assert f"{read:,} bytes read" in problem, problem
    assert pair_bytes([r"^a\.b[.]$", "^" + "a" * 140 + "00$"]) == 9 + 144
