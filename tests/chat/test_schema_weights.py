"""The lexer's states a counted character builds (dayzero.chat.schema_counts' ``counted_weight``):
a class of ASCII characters a ninth of any other, where llguidance itself builds so few."""

from __future__ import annotations

import pytest

from dayzero.chat.schema_counts import counted_weight
from dayzero.chat.schema_size import size_problem

from .lexer_replies import DEFAULTS, fails_mid_reply, strings


@pytest.mark.parametrize(
    "regex, weight",
    [
        ("^[a-z]{6000}$", 667),  # a class of ASCII characters: 1 of the lexer's states a character, not 9
        (r"^\d{900}[\-_A-Z]{900}\w{900}$", 300),  # (\d, \w: ASCII in llguidance's regexes)
        ("^.{6000}$", 6000),
        ("^[^a]{90}[a-zé]{90}\\s{90}[\\p{L}]{90}a{90}$", 450),  # negated, non-ASCII, \s, \p, a literal: 9
        (r"^[\x20-\x7e]{900}[\x{10000}-\x{10FFFF}]{90}[\u00e9]{90}$", 280),  # \x{..}, \u: non-ASCII ones
        ("(?i)^[a-z]{900}$", 900),  # case-insensitive: [a-z] holds the Kelvin sign, the long s
        (r"^(\d{1,2}){900}[0-9]{900}$", 1900),  # within a counted group (at the top: a ninth)
        ("^[[:alpha:]]{6000}$", 667),  # a POSIX class: ASCII ([A-Za-z]), not a class ending at its first "]"
        ("^[[:digit:][:upper:]_]{900}[[:^alpha:]]{90}[[:alpha:]\u00e9]{90}$", 280),  # (negated, beside é: 9)
    ],
)
def test_counted_weight(regex, weight):
    assert counted_weight(regex) == weight


def test_a_class_of_ascii_characters_is_counted_by_the_states_it_builds():
    """``^[a-z]{6000}$`` builds ~6,000 of the lexer's 50,000 states, where ``.{6000}`` fails at byte
    5,554: it was refused with ``.``'s count, and a reply writes it whole; two of 30,000 together
    are still refused (a reply failed ~50,000 bytes in)."""
    narrow = strings({"pattern": "^[a-z]{6000}$"}, {"pattern": "^\\d{6000}$"})
    assert size_problem([narrow], DEFAULTS) is None
    assert not fails_mid_reply(narrow, {"s0": "q" * 6000, "s1": "7" * 6000})
    both = strings({"pattern": "^[a-z]{30000}$"}, {"pattern": "^[0-9]{30000}$"})
    assert "counting 3,334 repeats (a class of ASCII characters" in size_problem([both], DEFAULTS)
    assert fails_mid_reply(both, {"s0": "q" * 30000, "s1": "7" * 30000})


def test_a_posix_class_is_counted_by_the_states_it_builds():
    """``[[:alpha:]]`` is ``[A-Za-z]`` to llguidance (POSIX classes are ASCII in Rust's regexes): it
    was weighed as a class of any characters, 6,000 refused, though a reply writes it whole (a
    reply of 52,000 failed 49,969 characters in, as ``[a-z]``'s does)."""
    posix = strings({"pattern": "^[[:alpha:]]{6000}$"}, {"pattern": "^[[:digit:]]{6000}$"})
    assert size_problem([posix], DEFAULTS) is None
    assert not fails_mid_reply(posix, {"s0": "q" * 6000, "s1": "7" * 6000})


@pytest.mark.parametrize(
    "regex, text",
    [
        (r"^[\x{10000}-\x{10FFFF}]{30000}$", "\U0001f600" * 30000),
        ("(?i)^[a-z]{30000}$", "q" * 30000),
        (r"^(\d{1,2}){18000}$", "7" * 36000),
    ],
    ids=["astral_class", "caseless", "counted_group"],
)
def test_a_class_a_ninth_would_let_through_fails_the_lexer(regex, text):
    """Each weighed a ninth (3,334; 3,334; 4,000: let through) though its states are more than one
    a character: every reply writing it failed 33,319, 16,663 or 2,227 bytes in (too many states;
    too many expressions; the last a group of varying length too: schema_splits)."""
    schema = strings({"pattern": regex})
    assert "a regular expression counting" in (size_problem([schema], DEFAULTS) or "")
    assert "repeating a group" not in size_problem([schema], DEFAULTS)  # (its count refused it first)
    assert fails_mid_reply(schema, {"s0": text})
