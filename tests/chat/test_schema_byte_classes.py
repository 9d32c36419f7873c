"""The byte classes a grammar's lexemes tell apart (dayzero.chat.schema_alphabet), against llguidance's
own count of them (its lexer's "alphabet size"): the bound on a run after a repeat without bound is
read off them (``most_after_unbounded``)."""

from __future__ import annotations

import pytest

from dayzero.chat.grammar import json_grammar
from dayzero.chat.schema_openapi import KNOWN_FORMATS
from dayzero.chat.schema_size import byte_classes, size_problem
from dayzero.chat.schema_splits import MOST_AFTER_UNBOUNDED_WIDE

from .lexer_replies import DEFAULTS, fails_mid_reply, llguidance_classes
from .test_schema_alphabet import _NAMES, _WIDE, _beside

_PATTERNS = {
    "x_n_letters": [f"^x{i}[a-z]+$" for i in range(40)],  # (its syntax no byte of the grammar's)
    "classes": [r"^[A-Z]{2}-\d{4}[\w.]*(?i:ab)\t[^\s]+$"],  # (\s: Unicode's; \d, \w: ASCII)
    "caseless": [r"(?i)^hello[a-f]+\.\x41é$"],  # (é's other case, É, too)
    "posix": [r"^[[:alpha:]_][[:^digit:]]*$"],
    "escaped": ['^[\\x00-\\x1f\\\\"]+$'],  # (written as JSON's escapes: \", \\, \n, \u001f)
    "utf8_ranges": ["^[😀-🙏€-₿]+$", "^[а-я]+$"],
    "coded": ["^[" + "".join(f"\\u{c:04x}" for c in range(0x100, 0x800, 3)) + "]+$"],  # (one lead byte, many last)
    "wide": _WIDE,
    "coded_braces": [r"^(?:\u{4E2D}|\u{6587}|\U{1F600}|\u{44F})+$"],  # (\u{..}, \U{..}: Rust's, any digits)
    "unanchored": ["[a-f]+q", "^x[0-9]"],  # (within any characters: .*[a-f]+q.*, their escapes too)
}
_OTHERS = {
    **{name: {f"p{i}": {"type": "string", "pattern": p} for i, p in enumerate(ps)} for name, ps in _PATTERNS.items()},
    "names": {name: {"type": "string"} for name in _NAMES},
    "cyrillic_enum": {"k": {"enum": ["".join(map(chr, range(0x410, 0x450)))]}},
    "cjk_names": {chr(c) + chr(c + 1): {"type": "integer"} for c in range(0x4E00, 0x4E00 + 30 * 37, 37)},
    "bounded_pattern": {"p": {"type": "string", "pattern": "^[a-z]+$", "minLength": 3}},  # (and .{3,})
    "tab_value": {"k": {"enum": ["x\ty"]}},  # (\t, and \u0009 read too)
    "values": {
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "a": {"type": "array"},
        "e": {"enum": [1, 'x"y', None]},
    },
}


def _most_admitted(others: dict, closed: bool) -> int:
    """The longest run ``.*.{n}`` beside ``others`` admits (by halves)."""
    admitted, refused = 0, 1200
    while refused - admitted > 1:
        count = (admitted + refused) // 2
        fits = size_problem([_beside(count, others, closed)], DEFAULTS) is None
        admitted, refused = (count, refused) if fits else (admitted, count)
    return admitted


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "open"])
@pytest.mark.parametrize("others", _OTHERS.values(), ids=_OTHERS.keys())
def test_the_classes_counted_are_llguidances(others, closed):
    """The bound names the byte classes the grammar tells apart: llguidance's own count (bytes each
    a literal's, ranges of a class or of ``.`` as UTF-8 writes them, JSON's escapes, a number's and a
    string's own rules), exactly, beside names, values and patterns of each kind."""
    schema = _beside(1000, others, closed)
    assert byte_classes([schema], DEFAULTS) == llguidance_classes(json_grammar(schema))


_FORMATTED = {  # (a format beside a length: within a string of any characters, ``.{5,}``, intersected)
    **{name: {"type": "string", "format": name} for name in sorted(KNOWN_FORMATS)},
    "date_at_least_5": {"type": "string", "format": "date", "minLength": 5},
    "uuid_at_most_50": {"type": "string", "format": "uuid", "maxLength": 50},
    "unknown": {"type": "string", "format": "int64"},  # (dropped: any string)
}


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "open"])
@pytest.mark.parametrize("formatted", _FORMATTED.values(), ids=_FORMATTED.keys())
def test_a_formats_classes_are_llguidances(formatted, closed):
    """A string format is written by llguidance's regular expression for it, which tells 32-48 classes
    apart beside the run (closed; 47-58 open): counted as printable ASCII (108), the run beside any
    format was refused past 448. Counted by its expression's byte sets: llguidance's count, never under."""
    schema = _beside(1000, {"f": formatted}, closed)
    assert byte_classes([schema], DEFAULTS) == llguidance_classes(json_grammar(schema))


def test_a_numbers_bounds_count_each_digit():
    """A number bounded (a minimum, a maximum) is written by digits told apart: counted each its own
    class, no fewer classes than llguidance's."""
    others = {"i": {"type": "integer", "minimum": 3, "maximum": 977}}
    schema = _beside(1000, others, closed=True)
    classes = llguidance_classes(json_grammar(schema))
    assert classes <= byte_classes([schema], DEFAULTS) <= classes + 4


@pytest.mark.parametrize(
    "others, closed, spelled_bound, whole",
    [
        (_OTHERS["x_n_letters"], False, 756, 887),
        (_OTHERS["x_n_letters"], True, 949, 1127),
        (_OTHERS["names"], False, 537, 646),
        (_OTHERS["names"], True, 628, 709),
    ],
    ids=["letters_patterns_open", "letters_patterns_closed", "common_names_open", "common_names_closed"],
)
def test_a_bound_by_classes_admits_more(others, closed, spelled_bound, whole):
    """Counted by the bytes names, values and patterns spell (their syntax too: ``^ [ - ] + $``), the
    run was bounded at ``spelled_bound`` where llguidance writes ``whole`` whole (measured); by the
    classes its lexer tells apart, more is admitted, and written whole."""
    most = _most_admitted(others, closed)
    assert spelled_bound < most <= whole
    assert size_problem([_beside(most, others, closed)], DEFAULTS) is None
    assert not fails_mid_reply(_beside(most, others, closed), {"s0": "a" * (most + 300)})


def test_a_unicode_class_counts_every_byte():
    r"""A class this reader does not follow (``\p{L}``) is counted as telling every byte apart: the least
    bound, admitted and written whole."""
    others = {"n": {"type": "string", "pattern": r"^\p{L}+$"}}
    assert byte_classes([_beside(1000, others, closed=True)], DEFAULTS) == 256
    assert _most_admitted(others, closed=True) == MOST_AFTER_UNBOUNDED_WIDE
