"""A count after a repeat without bound of the same characters (dayzero.chat.schema_splits'
``counted_after_unbounded``): each character written builds llguidance's lexer a branch more, checked
against llguidance itself: what is refused fails a reply that writes on past it, what is let through
is written whole."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_size import size_problem
from dayzero.chat.schema_splits import (
    MOST_AFTER_UNBOUNDED,
    MOST_AFTER_UNBOUNDED_CALLS,
    MOST_AFTER_UNBOUNDED_CLOSED,
    MOST_AFTER_UNBOUNDED_WIDE,
    counted_after_unbounded,
)

from .lexer_replies import DEFAULTS, call_fails_mid_reply, fails_mid_reply, strings


def _opened(pattern: str) -> dict:  # (more properties allowed: its lexer fails sooner than a closed one's)
    return {"type": "object", "properties": {"s0": {"type": "string", "pattern": pattern}}, "required": ["s0"]}


@pytest.mark.parametrize(
    "regex, repeats",
    [
        ("^.*.{2000}$", 2000),
        ("^.+.{1,2000}$", 2000),  # (its larger bound)
        ("^.*.{2000,}$", 2000),  # (its least, none larger)
        ("^.*-.{2000}$", 2001),  # (a character between, which the repeat reads too: counted)
        ("^(.*)x{2000}$", 2001),  # (within a group before it)
        ("^(a|.*|b).{2000}$", 2001),
        ("^.*.{1000}.{1000}$", 2000),  # (counts added up in a run: one count's alone was read)
        ("^.*(.{100}){20}$", 2000),  # (a group's repeats times its own counted run)
        ("^.*.{700}.*.{700}$", 1401),  # (another repeat without bound: the run goes on)
        ("^.*" + "." * 2000 + "$", 2000),  # (characters uncounted, one each)
        ("^[a-z]*-[a-z]{2000}$", 0),  # (a "-" no repeat before it reads: it ends the run)
        (r"^\d*\.\d{2000}$", 0),
        ("^[a-z]*-?[a-z]{2000}$", 2000),  # (... not where it is optional)
        ("^.*(ab){1200}$", 1200),  # (a group's repeats)
        ("^(ab)*(ab){1200}$", 1200),
        ("^.*.{1000}$", 1000),
        (f"^.*.{{{MOST_AFTER_UNBOUNDED_WIDE}}}$", 0),  # (within the least bound: not read)
        (r"^\w*\d{2000}$", 2000),
        ("^[[:alpha:]]*[[:alpha:]]{2000}$", 2000),
        ("(?i)^k*K{2000}$", 2000),  # (case-insensitive: the same letter)
        ("^.{2000}.*$", 0),  # (the count first)
        ("^a*b{2000}$", 0),  # (no character in common)
        ("^[a-z]*[0-9]{2000}$", 0),
        ("^[[:alpha:]]*[[:digit:]]{2000}$", 0),
        ("^(a*|b)|.{2000}$", 0),  # (another branch's)
        ("^.?.{2000}$", 0),  # (a bound)
    ],
)
def test_counted_after_unbounded(regex, repeats):
    assert counted_after_unbounded(regex) == repeats


@pytest.mark.parametrize(
    "schema, reply",
    [
        (strings({"pattern": "^.*.{2000}$"}), "a" * 2100),  # 1,558 characters in
        (strings({"pattern": "^a*.{2000}$"}), "a" * 2100),  # 1,512
        (strings({"pattern": "^.*-.{2000}$"}), "-" * 2100),  # 1,512
        (_opened("^.*.{1200}$"), "a" * 1800),  # 1,060
        (_opened(r"^\w*\d{2000}$"), "1" * 2100),  # 1,063 (a closed object's writes it whole)
        (_opened("^.*(ab){1300}$"), "ab" * 1400),  # 2,125: its 1,062nd repeat
        # each count within MOST_AFTER_UNBOUNDED, let through: 1,560 characters in, 1,069 in an open object
        (strings({"pattern": "^.*.{1000}.{1000}$"}), "a" * 2100),
        (strings({"pattern": "^.*(.{100}){20}$"}), "a" * 2100),
        (_opened("^.*.{700}.*.{700}$"), "a" * 1600),
    ],
    ids=["closed", "a_literal_before", "a_character_between", "open", "ascii_classes", "a_group"]
    + ["counts_in_a_run", "a_counted_group_in_a_run", "two_unbounded_in_a_run"],
)
def test_a_count_after_an_unbounded_repeat_is_refused(schema, reply):
    """Each let through (counted within ``MOST_COUNTED_CHARS``, no group of varying length): every
    reply writing on past it failed ("too many expressions constructed"), a broken stream after a 200."""
    assert fails_mid_reply(schema, {"s0": reply})
    problem = size_problem([schema], DEFAULTS) or ""
    assert "after a repeat without bound" in problem and f"{MOST_AFTER_UNBOUNDED:,}" in problem, problem


@pytest.mark.parametrize(
    "schema, reply",
    [
        (_opened(f"^.*.{{{MOST_AFTER_UNBOUNDED}}}$"), "a" * 1600),
        (_opened(f"^.*(ab){{{MOST_AFTER_UNBOUNDED}}}$"), "ab" * 1100),
        (_opened("^.{2000}.*$"), "a" * 2600),
        (_opened("^a*b{2000}$"), "a" * 100 + "b" * 2000),
        (_opened("^[a-z]*[0-9]{2000}$"), "x" * 100 + "1" * 2000),
        # refused for its one count of 2,000 after an unbounded [a-z]*: its "-" ends that repeat
        (_opened("^[a-z]*-[a-z]{2000}$"), "a" * 100 + "-" + "b" * 2000),
        (_opened(r"^\d*\.\d{2000}$"), "1" * 100 + "." + "2" * 2000),
    ],
    ids=["the_most", "the_most_groups", "the_count_first", "no_literal_in_common", "no_class_in_common"]
    + ["a_character_ends_the_run", "a_decimal_point_ends_the_run"],
)
def test_what_a_reply_writes_whole_is_let_through(schema, reply):
    assert size_problem([schema], DEFAULTS) is None
    assert not fails_mid_reply(schema, {"s0": reply})


@pytest.mark.parametrize("count, written_whole", [(MOST_AFTER_UNBOUNDED_CALLS, True), (900, False)])
def test_a_forced_calls_count_after_an_unbounded_repeat_is_bounded_by_its_grammar(count, written_whole):
    """A forced tool's parameters were bounded as an open object's (1,000): ``.*.{900}`` in a
    parameter's closed object was let through, and every call writing on past it failed 862
    characters in (its calls grammar writes ``.*.{852}`` whole alone, 660 among 32 tools)."""
    parameters = {"type": "object", "properties": {"o": strings({"pattern": f"^.*.{{{count}}}$"})}, "required": ["o"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    assert call_fails_mid_reply(tools, "f", {"o": {"s0": "a" * (count + 300)}}) is not written_whole
    problem = size_problem([parameters], DEFAULTS, calls=("f",))
    assert (problem is None) is written_whole, problem
    assert written_whole or f"at most {MOST_AFTER_UNBOUNDED_CALLS} can be enforced in forced tool calls" in problem


def _beside_patterns(count: int, patterns: int, closed: bool) -> dict:
    schema = _opened(f"^.*.{{{count}}}$") | ({"additionalProperties": False} if closed else {})
    schema["properties"] |= {f"p{i}": {"type": "string", "pattern": f"^x{i}[a-z]+$"} for i in range(patterns)}
    return schema


@pytest.mark.parametrize(
    "count, patterns, closed, written_whole",
    [
        (1000, 1, False, False),
        (849, 40, False, True),
        (1400, 1, True, False),
        (MOST_AFTER_UNBOUNDED_CLOSED, 40, True, True),
    ],
    ids=["open_past", "open_the_most", "closed_past", "closed_the_most"],
)
def test_an_objects_other_patterns_take_from_its_bound(count, patterns, closed, written_whole):
    """The bounds (1,000 open, 1,500 closed) were measured in an object of no other pattern: beside
    one (``^x0[a-z]+$``) ``.*.{1000}`` in an open object, ``.*.{1400}`` in a closed one, were let
    through, and every reply writing on past them failed; beside 10 to 160 such patterns
    ``.*.{887}`` is written whole in an open object (893 fails), ``.*.{1127}`` in a closed one; beside 40
    the grammar tells 57 byte classes apart in an open object, 44 in a closed one (llguidance's count):
    48,400 / 57 (849) and the closed bound (1,100) are admitted and written whole. Their syntax
    (``^ [ - ] + $``) counted as bytes spelled bounded the run at 756 and 949."""
    schema = _beside_patterns(count, patterns, closed)
    assert fails_mid_reply(schema, {"s0": "a" * (count + 300)}) is not written_whole
    assert (size_problem([schema], DEFAULTS) is None) is written_whole
