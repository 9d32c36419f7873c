"""The words of an error's message: a lone surrogate named as one, a number too long to repeat cut short."""

from __future__ import annotations

import re

from dayzero.params import is_unicode
from dayzero.settings_help import validation_message

SHOWN_DIGITS = 20  # of a longer number: its first digits, and how many it has
# a client's string quoted in the message (a model's name: 'm111...') is named whole, as sent
_QUOTED_OR_LONG_NUMBER = re.compile(rf"""(?<!\w)'[^'\n]*'|"[^"\n]*"|(\d{{{SHOWN_DIGITS + 1},}})""")


def shortened(message: str) -> str:
    """``message`` with each number over ``SHOWN_DIGITS`` digits cut to its first ones and its length:
    ``max_tokens 99999999999999999999... (4300 digits) exceeds ...`` (a 4300-digit max_tokens, Python's
    most, was repeated whole: a 4.3 kB message); a quoted string's digits are left as they are (an
    unknown model 'm' + 25 ones was named 'm11111111111111111111... (25 digits)', not as sent)."""
    return _QUOTED_OR_LONG_NUMBER.sub(_cut, message)


def _cut(found: re.Match) -> str:
    number = found[1]
    return found[0] if number is None else f"{number[:SHOWN_DIGITS]}... ({len(number)} digits)"


def validation_why(error: dict) -> str:
    """A pydantic error in a client's terms: a string with a lone surrogate as the tokenizer says it
    (pydantic's "unable to parse raw data as a unicode string" for a bounded string)."""
    text = error.get("input")
    if error.get("type") == "string_unicode" and isinstance(text, str):
        lone = next((char for char in text if not is_unicode(char)), "")
        return f"the text has a lone surrogate {lone!r} (not Unicode)"
    return validation_message(error)
