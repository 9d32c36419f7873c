"""The characters each atom of a regular expression reads, as llguidance reads Rust's regex syntax:
a literal its character, a class its ranges (its items folded to either case before it is negated,
under ``(?i)``), ``.`` all but a newline (all, under ``(?s)``), ``\\d`` and ``\\w`` ASCII, ``\\s``
Unicode's white space. What it does not follow (a Unicode class ``\\p{L}``, a class within a class,
a back reference) raises ``Unread``."""

from __future__ import annotations

import bisect
import functools
import re

from .schema_classes import QUANTIFIER

Ranges = list[tuple[int, int]]  # code points, [first, last] each
ANY: Ranges = [(0, 0x10FFFF)]
# Unicode's white space (Rust's ``\s``; ``\d`` and ``\w`` are ASCII to llguidance: ``[0-9]``, ``[0-9A-Z_a-z]``)
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A)]
_SPACE += [(0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
_CLASSES = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)], "s": _SPACE}
_CONTROLS = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "a": 0x07, "e": 0x1B, "0": 0x00}
# a coded character: \x{10FFFF}, \u{7FFF}, \U{7F} (any digits), \x7F, \u007F, \U0000007F
_CODED = re.compile(r"[xuU]\{([0-9A-Fa-f]{1,8})\}|x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})")
_POSIX = re.compile(r"\[:(\^?)([a-z]+):\]")
_POSIX_RANGES = {"alnum": "09AZaz", "alpha": "AZaz", "digit": "09", "lower": "az", "upper": "AZ", "xdigit": "09AFaf"}
_POSIX_RANGES |= {"word": "09AZ__az", "space": "\t\r  ", "blank": "\t\t  ", "punct": "!/:@[`{~", "graph": "!~"}
_POSIX_RANGES |= {"print": " ~", "cntrl": "\x00\x1f\x7f\x7f", "ascii": "\x00\x7f"}
_SYNTAX = set("^$|()*+?")
_GROUP_HEAD = re.compile(r"\(\?(?:[:=!]|P?<[A-Za-z_]\w*>|<[=!]|([A-Za-z-]*)[:)])")  # (flags: group 1)


class Unread(Exception):
    """A regular expression this reader does not follow."""


@functools.lru_cache(maxsize=1024)
def atoms(regex: str) -> list[Ranges]:
    """The characters each atom of ``regex`` reads (a literal's one, a class's, ``.``'s), in order,
    each as its group's flags read it (``i``: either case, ``s``: ``.`` any character)."""
    read, i, flags = [], 0, [""]  # (the flags set in each group open, innermost last)
    while i < len(regex):
        char, ranges, caseless = regex[i], [], "i" in flags[-1]
        if char == "\\":
            ranges, i = _escape(regex, i + 1, caseless)
        elif char == "[":
            ranges, i = _class(regex, i + 1, caseless)
        elif char == "(":
            head = _GROUP_HEAD.match(regex, i)
            on, _, off = (head[1] or "").partition("-") if head else ("", "", "")
            if not (head and head[0].endswith(")")):  # (a group opened; (?i) sets the flags of its own)
                flags.append(flags[-1])
            flags[-1] = "".join(f for f in flags[-1] + on if f not in off)
            i = head.end() if head else i + 1
        elif char == ")":
            flags, i = flags[:-1] or [""], i + 1
        elif char == "{" and (count := QUANTIFIER.match(regex, i)):
            i = count.end()
        else:
            dot = ANY if "s" in flags[-1] else complement([(0x0A, 0x0A)])
            literal = _folded([(ord(char), ord(char))], caseless)
            ranges, i = (dot if char == "." else [] if char in _SYNTAX else literal), i + 1
        read.append(ranges)
    return [atom for atom in read if atom]


def _escape(regex: str, i: int, caseless: bool) -> tuple[Ranges, int]:
    """The characters the escape at ``regex[i]`` (past its backslash) reads (``caseless``: either
    case, before a class is negated), and where it ends."""
    char = regex[i : i + 1]
    if coded := _CODED.match(regex, i):
        code = min(int(next(filter(None, coded.groups())), 16), 0x10FFFF)
        return _folded([(code, code)], caseless), coded.end()
    if char.lower() in _CLASSES:
        ranges = _folded(_CLASSES[char.lower()], caseless)
        return (complement(ranges) if char.isupper() else ranges), i + 1
    if char in "pPkgcx" or char.isdigit() and char != "0":  # (Unicode classes, back references: not followed)
        raise Unread(regex)
    if char in "bBAzZ<>":  # (assertions: no character)
        return [], i + 1
    code = _CONTROLS.get(char, ord(char or "\\"))
    return _folded([(code, code)], caseless), i + 1


def _class(regex: str, i: int, caseless: bool) -> tuple[Ranges, int]:
    """The characters the class opened before ``regex[i]`` reads (``caseless``: either case, before
    it is negated), and where it ends (past its "]")."""
    negated = regex.startswith("^", i)
    i, ranges, first = i + negated, [], True
    while i < len(regex) and (regex[i] != "]" or first):
        first = False
        if posix := _POSIX.match(regex, i):
            if (bounds := _POSIX_RANGES.get(posix[2])) is None:
                raise Unread(regex)
            held = [(ord(a), ord(b)) for a, b in zip(bounds[::2], bounds[1::2], strict=True)]
            ranges, i = ranges + (complement(held) if posix[1] else held), posix.end()
            continue
        if regex[i] == "[" or regex.startswith(("&&", "--", "~~"), i):  # (classes within, set operations)
            raise Unread(regex)
        low, i = _escape(regex, i + 1, False) if regex[i] == "\\" else ([(ord(regex[i]),) * 2], i + 1)
        if regex.startswith("-", i) and not regex.startswith("-]", i) and len(low) == 1 and i + 1 < len(regex):
            high, i = _escape(regex, i + 2, False) if regex[i + 1] == "\\" else ([(ord(regex[i + 1]),) * 2], i + 2)
            low = [(low[0][0], high[-1][1])] if len(high) == 1 else low + high
        ranges += low
    if i >= len(regex):
        raise Unread(regex)
    ranges = _folded(ranges, caseless)
    return (complement(ranges) if negated else ranges), i + 1


def _folded(ranges: Ranges, caseless: bool) -> Ranges:
    """``ranges`` (``caseless``: and the characters of the same case folding, ``k``: ``K`` and the Kelvin sign)."""
    if not caseless:
        return ranges
    ranges = complement(complement(ranges))
    outside, (by_code, by_other) = complement(ranges), _folds()
    if _count(by_code, ranges) <= _count(by_other, outside):  # (a wide class: found from the few outside it)
        within = [(c, other) for c, other in _slices(by_code, ranges) if not _holds(ranges, other)]
    else:
        within = [(c, other) for other, c in _slices(by_other, outside) if _holds(ranges, c)]
    return ranges + [(other, other) for _, other in within]


def _count(pairs: list[tuple[int, int]], ranges: Ranges) -> int:
    """How many of ``pairs`` (in order) have their first within ``ranges``."""
    return sum(bisect.bisect_left(pairs, (hi + 1,)) - bisect.bisect_left(pairs, (lo,)) for lo, hi in ranges)


def _slices(pairs: list[tuple[int, int]], ranges: Ranges) -> list[tuple[int, int]]:
    """The ``pairs`` (in order) whose first is within ``ranges``."""
    return [
        p for lo, hi in ranges for p in pairs[bisect.bisect_left(pairs, (lo,)) : bisect.bisect_left(pairs, (hi + 1,))]
    ]


def _holds(ranges: Ranges, code: int) -> bool:
    i = bisect.bisect_right(ranges, (code, 0x10FFFF))
    return i > 0 and ranges[i - 1][1] >= code


@functools.cache
def _folds() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Each character of another case and that one, in order, and the same pairs the other way."""
    cases: dict[str, list[int]] = {}
    for code in range(0x20000):  # (no character past the SMP has another case)
        upper = chr(code).upper()  # (``ſ`` has no lower case of its own: its upper case's, ``s``)
        lower = upper.lower() if len(upper) == 1 and len(upper.lower()) == 1 else chr(code).lower()
        if len(lower) == 1 and (lower != chr(code) or upper != chr(code)):
            cases.setdefault(lower, []).append(code)
    pairs = sorted((c, other) for codes in cases.values() for c in codes for other in codes if other != c)
    return pairs, sorted((other, c) for c, other in pairs)


def complement(ranges: Ranges) -> Ranges:
    """The characters not in ``ranges``, as ranges in order (twice: ``ranges`` in order, merged)."""
    held, start = [], 0
    for lo, hi in sorted(ranges):
        if lo > start:
            held.append((start, lo - 1))
        start = max(start, hi + 1)
    return held + ([(start, 0x10FFFF)] if start <= 0x10FFFF else [])
