"""Counted groups of varying length (dayzero.chat.schema_splits): the ways llguidance's lexer holds
to split a reply's text among their repeats, checked against llguidance itself: what is refused
fails a reply that writes it, what is let through is written whole."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_size import size_problem
from dayzero.chat.schema_splits import MOST_SPLITS, split_ways

from .lexer_replies import DEFAULTS, fails_mid_reply, strings


@pytest.mark.parametrize(
    "regex, ways",
    [
        ("^(.{1,2}){1900}$", 3800),  # 1,900 repeats * (2 - 1) * (2 - 1 + 1) / 1
        ("^(.{2,3}){1000}$", 1000),  # / 2: a longer least repeat, fewer repeats in a text
        ("^(.+){2000}$", 2400),  # unbounded: 6/5 of its repeats
        ("^(a|aa){3000}$", 6000),  # branches of lengths 1 and 2
        ("^(?:.{1,2}){300}$", 600),
        ("^(?P<n>.{1,2}){300}$", 600),
        ("^.{3000}$", 0),  # no group
        ("(abc){2000}", 0),  # a group of one length
        (r"^(\d{3}-){3}\d{4}$", 0),
        (r"^\x{10000}{5}$", 0),  # (a braced escape is one character)
        (r"^(\pL|..){1900}$", 3800),  # (as is any escape of one: not two, as lengths [2, 2])
        (r"^(\x61|\u0061\U00000062){300}$", 600),
        (r"^([[:alpha:]]|..){300}$", 600),  # (a class within a class is one character)
        (r"^([a[\]b]]|..){300}$", 600),
        (r"(?x)^(. |..){300}$", 600),  # (under the x flag whitespace and comments are no characters)
        ("^(?x:(. # one\n|..)){300}$", 600),
        (r"^(?x)(?-x)(. |..){300}$", 0),
        (r"^(?P<x>. |..){300}$", 0),
        ("^(.?){4000}$", 0),
        ("^(.{0,2}){300}$", 600),  # (a least of 0: as its twin (.{1,2}){300}, both failing from ~725)
        ("^(a?b?c?){300}$", 1800),  # (an optional character: .{0,4000} to the lexer)
        (r"^([a-z]+\.)*[a-z]+$", 0),  # repeated without a count: states the lexer reuses
    ],
)
def test_split_ways(regex, ways):
    assert split_ways(regex) == ways


@pytest.mark.parametrize(
    "regex, written",
    [("^(.{1,2}){1900}$", 3800), ("^(.+){2000}$", 2000)],
    ids=["range", "unbounded"],
)
def test_a_group_split_past_the_lexer_is_refused(regex, written):
    """Counted 3,800 and 2,000 characters (let through), every reply writing them failed 1,106 and
    858 characters in ("too many expressions constructed"): a broken stream after a 200."""
    schema = strings({"pattern": regex})
    assert fails_mid_reply(schema, {"s0": "a" * written})
    problem = size_problem([schema], DEFAULTS) or ""
    assert "repeating a group of varying length" in problem and f"at most {MOST_SPLITS}" in problem, problem


@pytest.mark.parametrize(
    "regex",
    [
        r"^(\pL|..){1900}$",
        r"^(\PN|..){1900}$",
        r"^([[:alpha:]]|..){1900}$",
        r"^([a[b]]|..){1900}$",
        r"(?x)^(. |..){1900}$",
    ],
)
def test_a_group_of_one_character_escapes_or_classes_is_split_as_one(regex):
    r"""A one-character escape (\pL) read as two characters, a class within a class ended at its
    first "]", a space under the x flag read as one: lengths [2, 2], no ways, let through; every
    reply writing 3,800 failed (\pL 332 bytes in, \PN 398)."""
    schema = strings({"pattern": regex})
    assert fails_mid_reply(schema, {"s0": "a" * 3800})
    assert "repeating a group of varying length" in (size_problem([schema], DEFAULTS) or "")


@pytest.mark.parametrize("regex", ["^(.?){4000}$", "^([ab]?){4000}$"])
def test_a_counted_optional_character_is_let_through(regex):
    """Refused as 8,000 ways, but written whole (4,000 characters, as often as a reply writes it)."""
    schema = strings({"pattern": regex})
    assert size_problem([schema], DEFAULTS) is None
    assert not any(fails_mid_reply(schema, {"s0": "a" * n}) for n in (4000, 2000, 4000))


@pytest.mark.parametrize("regex, written", [("^(.{1,2}){300}$", 600), ("^(.{2,3}){600}$", 1800)])
def test_the_most_splits_let_through_are_written_whole(regex, written):
    schema = strings({"pattern": regex})
    assert split_ways(regex) == MOST_SPLITS
    assert size_problem([schema], DEFAULTS) is None
    assert not fails_mid_reply(schema, {"s0": "a" * written})


def _opened(pattern: str) -> dict:  # (more properties allowed: its lexer fails sooner than strings')
    return {"type": "object", "properties": {"s0": {"type": "string", "pattern": pattern}}, "required": ["s0"]}


@pytest.mark.parametrize("repeats, written_whole", [(300, True), (1000, False)])
def test_a_group_of_least_zero_is_split_as_its_twin_of_least_one(repeats, written_whole):
    """``(.{0,2}){300}``, counted 1,800 ways (as [0, 2]), was refused though written whole; with
    1,000 repeats every reply writing it fails 742 bytes in: still refused."""
    schema = _opened(f"^(.{{0,2}}){{{repeats}}}$")
    assert fails_mid_reply(schema, {"s0": "a" * 2 * repeats}) is not written_whole
    assert (size_problem([schema], DEFAULTS) is None) is written_whole


@pytest.mark.parametrize("repeats, written_whole", [(500, True), (600, False)])
def test_a_group_without_bound_weighs_six_fifths_a_repeat(repeats, written_whole):
    """``(.+){600}``, 600 ways, was let through: in an open object every reply writing on past it
    fails 565 characters in (560 repeats written whole there, 580 fail); 500, 600 ways, are written whole."""
    schema = _opened(f"^(.+){{{repeats}}}$")
    assert fails_mid_reply(schema, {"s0": "a" * 3000}) is not written_whole
    assert (size_problem([schema], DEFAULTS) is None) is written_whole
