"""The characters llguidance's lexer counts across one grammar (dayzero.chat.schema_counts), checked
against llguidance itself: what is refused fails a reply that writes it, what is let through does not."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_counts import MOST_COUNTED_CHARS, counted_repeats
from dayzero.chat.schema_size import size_problem

from .lexer_replies import DEFAULTS, fails_mid_reply, strings


@pytest.mark.parametrize(
    "regex, count",
    [
        ("^.{3000}$", 3000),
        ("^(.{100}){60}$", 6000),  # a group's count times its own
        ("((a{10}){10}){100}", 10_000),
        ("^.{3000}-.{2900}$", 5900),  # a sequence's counts add up
        ("(?:a{3}b{4}){2}", 14),
        ("a{1,30000}", 30_000),  # the larger bound
        ("(abc){2000}", 2000),  # a group with no count of its own: its count alone
        ("[a-z{5}]{7}", 7),  # a class is one character
        (r"\{5}", 0),  # an escaped brace counts nothing
        (r"\x{800}\u{900}\U{5000}\p{Greek}", 0),  # a coded character's digits (a class's name) count nothing
        (r"\x{800}{3}\x41{2}", 5),  # its count after it
        ("abc", 0),
        ("a{" + "9" * 4400 + "}", 10**12),  # (Python reads no number of over 4,300 digits)
        ("(" * 44 + "a" + ("){" + "9" * 100 + "}") * 44, 10**12),  # (nor writes one: 4,400 digits)
    ],
)
def test_counted_repeats(regex, count):
    assert counted_repeats(regex) == count


@pytest.mark.parametrize(
    "counts",
    [
        ({"minLength": 3000}, {"minLength": 2900}),
        ({"pattern": "^.{3000}$"}, {"pattern": "^.{2900}$"}),
        ({"minLength": 3000}, {"pattern": "^.{2900}$"}),
        ({"pattern": "^(.{100}){60}$"},),
    ],
    ids=["min_lengths", "patterns", "both", "nested"],
)
def test_counts_past_the_lexer_together_are_refused(counts):
    """Each within a lexeme's bound (but nested), together past the lexer's states: every reply
    writing them failed ~5,560 bytes in."""
    schema = strings(*counts)
    lengths = [c.get("minLength") or counted_repeats(c["pattern"]) for c in counts]
    assert fails_mid_reply(schema, {f"s{i}": "a" * n for i, n in enumerate(lengths)})
    problem = size_problem([schema], DEFAULTS) or ""
    named = [
        f"minLength {n:,}" if "minLength" in c else f"regular expression counting {n:,}"
        for c, n in zip(counts, lengths, strict=True)
    ]
    assert any(name in problem for name in named) and f"at most {MOST_COUNTED_CHARS:,}" in problem, problem


def test_counts_are_summed_once_a_lexeme_and_across_schemas():
    """The same string schema in two properties (or an array's items) is one lexeme: counted once;
    two schemas of one request (tools' parameters) are one grammar: counted together."""
    half = {"minLength": MOST_COUNTED_CHARS // 2 + 1}
    assert size_problem([strings(half, half)], DEFAULTS) is None
    assert not fails_mid_reply(strings(half, half), {"s0": "a" * half["minLength"], "s1": "b" * half["minLength"]})
    other = {"minLength": MOST_COUNTED_CHARS // 2}
    assert size_problem([strings(half), strings(other)], DEFAULTS) is not None
    assert size_problem([strings(other), strings(other)], DEFAULTS) is None


def test_coded_characters_are_admitted_and_written():
    """Their digits are no count: ``^\\x{800}\\x{900}\\x{5000}\\x{6000}$`` was refused as counting
    12,700 repeats, a 400 for a pattern of four characters that llguidance compiles and writes."""
    schema = strings({"pattern": r"^\x{800}\x{900}\x{5000}\x{6000}$"})
    assert size_problem([schema], DEFAULTS) is None
    assert not fails_mid_reply(schema, {"s0": "\u0800\u0900\u5000\u6000"})


def test_the_most_let_through_is_written_whole():
    schema = strings({"minLength": MOST_COUNTED_CHARS - 1000}, {"pattern": "^.{1000}$"})
    assert size_problem([schema], DEFAULTS) is None
    assert not fails_mid_reply(schema, {"s0": "a" * (MOST_COUNTED_CHARS - 1000), "s1": "b" * 1000})


def test_a_refusal_says_ninths_only_where_it_weighed_them():
    wide = size_problem([{"type": "string", "pattern": "^.{5000}$"}], DEFAULTS)
    assert wide.startswith("a regular expression counting 5,000 repeats: "), wide
    narrow = size_problem([{"type": "string", "pattern": "^[a-z]{45000}$"}], DEFAULTS)
    assert narrow.startswith("a regular expression counting 5,000 repeats (a class of ASCII characters"), narrow


def _object(name: str, low: int) -> dict:
    string = {"type": "string", "minLength": low}
    return {"type": "object", "properties": {name: string}, "required": [name], "additionalProperties": False}


def test_the_branches_of_a_union_are_counted_together():
    """One reply writes one branch, but a compiled grammar's lexer is shared by every matcher of it
    (``Grammars.matcher``: a copy of the compiled one; a worker's requests repeating a schema), its
    states kept: a reply writing the first branch (2,900 characters) let one writing the second
    (3,000, each within the lexer alone) fail 2,658 bytes in, and every later one at its first
    byte. Counted as the most of the branches (3,000), it would be let through."""
    union = {"anyOf": [_object("t", 2900), _object("s", 3000)]}
    assert not fails_mid_reply(union, {"t": "a" * 2900})
    assert fails_mid_reply(union, {"s": "a" * 3000})
    assert "5,900 characters counted with the request's other counts" in (size_problem([union], DEFAULTS) or "")
