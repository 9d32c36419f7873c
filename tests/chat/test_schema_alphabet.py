"""The bounds on a count after a repeat without bound (``schema_splits``) against the byte classes a
grammar's lexemes tell apart (its lexer's alphabet, ``schema_alphabet``), checked against llguidance
itself: its own count of them, and the replies it writes whole."""

from __future__ import annotations

import re
import string

import pytest

from dayzero.chat.grammar import dsml_symbol, json_grammar, tool_calls_grammar
from dayzero.chat.schema_size import byte_classes, size_problem
from dayzero.chat.schema_splits import MOST_AFTER_UNBOUNDED_WIDE, most_after_unbounded
from dayzero.chat.tokens import DSML

from .lexer_replies import DEFAULTS, call_fails_mid_reply, fails_mid_reply, llguidance_classes

_ASCII = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\<')  # (no "<": a call's parameter)
_NAMES = ["id", "user_name", "firstName", "lastName", "emailAddress", "phone_number", "createdAt", "zipCode"]
_NAMES += ["country", "unitPrice", "totalAmount", "orderItems", "trackingNumber", "isVerified", "jobTitle"]
_NAMES += ["websiteURL", "avatar_url", "X-Request-ID", "taxRate", "discountCode", "QA/Review", "v2.1"]
_WIDE = [  # every printable ASCII character, 2-, 3- and 4-byte UTF-8 ones
    "^" + re.escape(_ASCII) + "$",
    "^" + "".join(map(chr, range(0xA1, 0x800))) + "$",
    "^" + "".join(chr(c) for c in range(0x800, 0x10000, 0x40) if not 0xD800 <= c < 0xE000) + "$",
    "^" + "".join(map(chr, range(0x10000, 0x110000, 0x1000))) + "$",
]


def _beside(count: int, others: dict, closed: bool) -> dict:
    counted = {"type": "string", "pattern": f"^.*.{{{count}}}$"}
    schema = {"type": "object", "properties": {"s0": counted, **others}, "required": ["s0"]}
    return schema | ({"additionalProperties": False} if closed else {})


_REFUSED = "can be enforced in a grammar whose names, values and patterns tell"


def _bound(schema: dict) -> int:
    """The most ``schema``'s refusal lets its run count."""
    return int(
        re.search(r"at most ([\d,]+) can be enforced", size_problem([schema], DEFAULTS) or "")[1].replace(",", "")
    )


def _refused_and_the_bound_written_whole(count: int, others: dict, closed: bool, counted: bool = True) -> int:
    """``.*.{count}`` beside ``others`` fails a reply past it (llguidance) and is refused; the bound
    there is admitted and written whole, and (``counted``) is the bound by llguidance's own count of
    the grammar's byte classes. The bound."""
    schema = _beside(count, others, closed)
    assert fails_mid_reply(schema, {"s0": "a" * (count + 300)})
    assert _REFUSED in (size_problem([schema], DEFAULTS) or "")
    most = _bound(schema)
    assert not counted or most == most_after_unbounded(llguidance_classes(json_grammar(schema)))
    assert size_problem([_beside(most, others, closed)], DEFAULTS) is None
    assert not fails_mid_reply(_beside(most, others, closed), {"s0": "a" * (most + 300)})
    return most


_COMMON = {name: {"type": "string"} for name in _NAMES}
_ENUM = {"k": {"enum": [_ASCII]}}


@pytest.mark.parametrize(
    "others, count, closed, whole",
    [(_COMMON, 725, True, 709), (_COMMON, 662, False, 646), (_ENUM, 600, True, 459), (_ENUM, 600, False, 451)],
    ids=["names", "names_open", "enum", "enum_open"],
)
def test_a_count_within_the_bounds_beside_many_bytes_is_refused(others, count, closed, whole):
    """Each count was within its bound (850 open, 1,100 closed), measured beside 25 bytes; beside common
    property names (52 bytes), or an enum of printable ASCII (91), it was admitted and every reply
    failed; what the grammar writes whole there (measured: ``whole``) is admitted."""
    assert _refused_and_the_bound_written_whole(count, others, closed) <= whole


def _call(count: int) -> tuple[list[dict], dict]:
    parameters = {"type": "object", "properties": {"o": _beside(count, {}, closed=True), **_ENUM}, "required": ["o"]}
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}], parameters


def test_a_forced_calls_count_beside_many_bytes_is_refused():
    """Within forced calls' bound (600), ``.*.{450}`` beside an enum of printable ASCII was admitted,
    and every call writing on past it failed; the bound there is admitted and written whole."""
    tools, parameters = _call(450)
    assert call_fails_mid_reply(tools, "f", {"o": {"s0": "a" * 750}})
    problem = size_problem([parameters], DEFAULTS, calls=("f",)) or ""
    assert _REFUSED in problem, problem
    most = int(re.search(r"at most (\d+) can be enforced", problem)[1])
    tools, parameters = _call(most)
    assert size_problem([parameters], DEFAULTS, calls=("f",)) is None
    assert not call_fails_mid_reply(tools, "f", {"o": {"s0": "a" * (most + 300)}})


# a tool's name of bytes no DSML tag spells (its calls' tag spells it: ``invoke name="..."``)
_LONG_NAME = string.ascii_uppercase + string.digits + "-hjqwxyzbd"


def test_a_forced_calls_tool_name_is_counted():
    """A forced call's tag spells its tool's name, each byte a class of its own: beside a name of 46
    bytes no tag spells, ``.*.{600}`` (forced calls' bound) was admitted (69 classes counted, 93 by
    llguidance) and every call writing on past 560 failed; refused now, and the bound there admitted
    and written whole."""

    def call(count: int) -> tuple[list[dict], dict]:
        parameters = {"type": "object", "properties": {"o": _beside(count, {}, closed=True)}, "required": ["o"]}
        return [{"type": "function", "function": {"name": _LONG_NAME, "parameters": parameters}}], parameters

    tools, parameters = call(600)
    assert call_fails_mid_reply(tools, _LONG_NAME, {"o": {"s0": "a" * 900}})
    lark = tool_calls_grammar(tools, dsml_symbol(None, DSML), one=_LONG_NAME)
    assert byte_classes([parameters], DEFAULTS, calls=(_LONG_NAME,)) >= llguidance_classes(lark)
    problem = size_problem([parameters], DEFAULTS, calls=(_LONG_NAME,)) or ""
    assert _REFUSED in problem, problem
    most = int(re.search(r"at most (\d+) can be enforced", problem)[1])
    tools, parameters = call(most)
    assert size_problem([parameters], DEFAULTS, calls=(_LONG_NAME,)) is None
    assert not call_fails_mid_reply(tools, _LONG_NAME, {"o": {"s0": "a" * (most + 300)}})


@pytest.mark.parametrize("closed", [True, False])
def test_the_wide_bound_is_written_whole_beside_every_byte(closed):
    """Beside every printable ASCII character and UTF-8 ones of each length, the least bound is
    admitted and written whole (228 was, 237 failed)."""
    wide = {f"w{i}": {"type": "string", "pattern": p} for i, p in enumerate(_WIDE)}
    schema = _beside(MOST_AFTER_UNBOUNDED_WIDE, wide, closed)
    assert size_problem([schema], DEFAULTS) is None
    assert not fails_mid_reply(schema, {"s0": "a" * (MOST_AFTER_UNBOUNDED_WIDE + 300)})


@pytest.mark.parametrize("closed", [True, False])
def test_a_format_counts_the_classes_of_its_expression(closed):
    """A format's regular expression tells some bytes apart: beside date-time and uri, ``.*.{1100}``
    in a closed object, ``.*.{850}`` in an open one (their bounds) failed every reply. Counted as
    printable ASCII, each byte a class of its own (108 classes, where llguidance counts 56 closed
    and 63 open), the run was bounded at 448 beside any format; counted by the byte sets of its
    expression, the bound is llguidance's own count's (864 closed, 768 open), admitted and written whole."""
    formats = {"d": {"type": "string", "format": "date-time"}, "u": {"type": "string", "format": "uri"}}
    most = _refused_and_the_bound_written_whole(1100 if closed else 850, formats, closed)
    assert most > MOST_AFTER_UNBOUNDED_WIDE + 150  # (not the floor: the formats' bytes counted, not all 256)


_CODED = "^[" + "".join(f"\\u{c:04x}" for c in range(0x100, 0x800, 3)) + "]+$"  # (27 bytes as written)


@pytest.mark.parametrize(
    "pattern, count", [(r"^\p{L}+$", 400), (r"^[\p{L} .'-]+$", 400), (_CODED, 800)], ids=["letters", "name", "coded"]
)
@pytest.mark.parametrize("closed", [True, False])
def test_a_count_beside_escapes_telling_many_bytes_apart_is_refused(pattern, count, closed):
    """A Unicode class, or characters coded by escapes, spell few bytes as written (13, 18, 27) but
    tell many apart: ``count`` was admitted (1,100 closed, 850 open; 1,052 and 824) and every reply
    failed; refused now, and the bound admitted there written whole (a Unicode class is not followed:
    counted as every byte, the least bound)."""
    others = {"n": {"type": "string", "pattern": pattern}}
    _refused_and_the_bound_written_whole(count, others, closed, counted=pattern == _CODED)


_CJK = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 10 * 37, 37))  # (10 characters, 3 bytes each)
_CYRILLIC = "".join(map(chr, range(0x410, 0x450)))  # (А-я, 2 bytes each)


@pytest.mark.parametrize(
    "text, count, closed",
    [(_ASCII[:15], 1100, True), (_ASCII[:52], 640, True), (_CJK, 850, False), (_CYRILLIC, 470, False)],
    ids=["punctuation_closed", "ascii_closed", "cjk_open", "cyrillic_open"],
)
def test_a_count_the_fit_through_25_bytes_admitted_is_refused(text, count, closed):
    """Swept beside enums of 18 to 73 bytes: the fit through the bounds at 25 admitted ``count`` (1,100
    and 651 closed, 850 and 488 open) where llguidance wrote 1,083 (punctuation, 18 bytes), 626 (ASCII,
    55), 777 (CJK, 23), 446 (Cyrillic, 73) whole and failed every reply past; refused now, and the bound
    there admitted and written whole."""
    others = {"k": {"enum": [text]}}
    _refused_and_the_bound_written_whole(count, others, closed)


_CASELESS_CYRILLIC = "(?i)^" + "".join(map(chr, range(0x430, 0x450))) + "$"  # (а-я: А-Я read too)
_CASELESS_GREEK = "(?i)^" + "".join(map(chr, range(0x3B1, 0x3CA))) + "$"  # (α-ω: Α-Ω read too)


@pytest.mark.parametrize(
    "others, count, closed",
    [
        ({"n": {"type": "string", "pattern": _CASELESS_CYRILLIC}}, 663, True),
        ({"n": {"type": "string", "pattern": _CASELESS_CYRILLIC}}, 562, False),
        ({"n": {"type": "string", "pattern": _CASELESS_GREEK}, "e": {"enum": [_CASELESS_CYRILLIC[5:-1]]}}, 636, True),
    ],
    ids=["cyrillic_closed", "cyrillic_open", "greek_beside_cyrillic"],
)
def test_a_count_beside_a_caseless_pattern_counts_its_other_cases(others, count, closed):
    """A caseless pattern of Cyrillic or Greek letters tells their upper case's UTF-8 bytes apart too,
    spelled or not: counted as spelled (45, 48 bytes), ``count`` was admitted and every reply failed
    (Cyrillic, closed: 513 written whole, 520 failed); refused now, and the bound there written whole.
    ASCII letters' other case reads alike (``(?i)^[a-z]{26}``-like: 790 whole beside 34 bytes)."""
    _refused_and_the_bound_written_whole(count, others, closed)
