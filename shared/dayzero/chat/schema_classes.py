"""Character classes of a regular expression as llguidance reads them (Rust's regex syntax): where
one ends, the classes nested within it (``[a[bc]]``, ``[[:alpha:]]``); a POSIX class by the ASCII
characters it holds (``[[:alpha:]]`` is ``[A-Za-z]`` to it)."""

from __future__ import annotations

import re

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
CASELESS = re.compile(r"\(\?[a-zA-Z]*i")  # an i flag: (?i), (?ix:...)


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


def posix_spelled(text: str) -> str | None:
    """The class ``text`` ("[...]") with each POSIX class in it spelled as its ASCII ranges
    (``[[:alpha:]_]``: ``[A-Za-z_]``); None where one is negated or unknown."""
    names = _POSIX.findall(text)
    if any(negated or name not in POSIX for negated, name in names):
        return None
    return _POSIX.sub(lambda found: POSIX[found[2]], text)
