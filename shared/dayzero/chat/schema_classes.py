"""Character classes of a regular expression as llguidance reads them (Rust's regex syntax): where
one ends, the classes nested within it (``[a[bc]]``, ``[[:alpha:]]``); a POSIX class by the ASCII
characters it holds (``[[:alpha:]]`` is ``[A-Za-z]`` to it); and the characters an atom of one
character may read, of some tried (``characters``: two atoms sharing none share no character)."""

from __future__ import annotations

import functools
import re
import warnings

# the POSIX classes, ASCII only in Rust's regex syntax (measured, llguidance 1.9: a reply of
# ``[[:alpha:]]{52000}`` failed 49,969 characters in, as ``[a-z]``'s; ``[[:^alpha:]]{6000}`` 5,552)
POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": r"\x00-\x7F",
    "blank": r"\t ",
    "cntrl": r"\x00-\x1F\x7F",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": r"!-/:-@\[-\x60{-~",
    "space": r"\t\n\x0B\x0C\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_POSIX = re.compile(r"\[:(\^?)([a-z]*):\]")
# an escape of one character: \x{10000}, \x61, \u0061, \U00000061, \p{L}, \pL (read a character a
# backslash, ``(\pL|..){1900}`` was lengths [2, 2], let through: every reply failed 332 bytes in)
_ESCAPE = re.compile(r"\\(?:[xuUpP]\{[^}]*\}|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[pP].|.)", re.DOTALL)
QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")  # a quantifier's {n}, {n,}, {n,m}
CASELESS = re.compile(r"\(\?[a-zA-Z]*i")  # an i flag: (?i), (?ix:...)
# characters an atom is tried on: ASCII, and some outside it (a Kelvin sign, an emoji, ...)
_TRIED = [chr(c) for c in range(128)] + ["\u00e9", "\u212a", "\u017f", "\u4e2d", "\u0660", "\U0001f600"]
_ALL = frozenset(_TRIED)


def class_end(regex: str, start: int) -> int:
    """Where the character class opened at ``start`` ends (past its "]"; the text's end: none), its
    nested classes within it (``[a[bc]]``, ``[[:alpha:]]``: one character, as "]" ended them
    before: ``([[:alpha:]]|..){1900}`` was let through to fail every reply)."""
    depth, i = 0, start
    while i < len(regex):
        if regex[i] == "\\":
            i += 1
        elif regex[i] == "[":
            depth += 1
            i += regex.startswith("^", i + 1)  # (a "]" first in a class, negated or not, is a character)
            i += regex.startswith("]", i + 1)
        elif regex[i] == "]":
            depth -= 1
            if not depth:
                return i + 1
        i += 1
    return len(regex)


def escape_end(regex: str, start: int) -> int:
    """Where the escape of one character at ``start`` (its backslash) ends: past its coded
    character's digits too (``\\x{800}``: not a character counted 800 times), or its class's name
    (``\\p{Greek}``); the text's end where nothing follows the backslash."""
    escape = _ESCAPE.match(regex, start)
    return escape.end() if escape else len(regex)


def posix_spelled(text: str) -> str | None:
    """The class ``text`` ("[...]") with each POSIX class in it spelled as its ASCII ranges
    (``[[:alpha:]_]``: ``[A-Za-z_]``); None where one is negated or unknown."""
    names = _POSIX.findall(text)
    if any(negated or name not in POSIX for negated, name in names):
        return None
    return _POSIX.sub(lambda found: POSIX[found[2]], text)


@functools.lru_cache(maxsize=4096)
def characters(atom: str | None, caseless: bool) -> frozenset[str]:
    """The characters of ``_TRIED`` that ``atom`` (the text of one character: a literal, an escape,
    ".", a class; None: a group) may read, as Python reads it: all of them where it cannot read one
    (a group, ``\\pL``, a class nested within a class) or reads none of them (``[\\u0100]``), so
    two atoms sharing none of them share no character."""
    spelled = posix_spelled(atom) if atom is not None and atom.startswith("[") else atom
    if spelled is None or spelled.startswith("[") and "[" in spelled[1:].replace("\\[", ""):
        return _ALL
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Python's FutureWarning on a "[" within a class)
            # (caseless: Unicode's folding, as Rust's: (?i)k reads the Kelvin sign)
            reading = re.compile(spelled, re.IGNORECASE if caseless else re.ASCII)
    except (re.error, OverflowError, RecursionError):
        return _ALL
    return frozenset(c for c in _TRIED if reading.fullmatch(c)) or _ALL
