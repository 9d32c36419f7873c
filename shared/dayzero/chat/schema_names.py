"""The names of an object's patternProperties, as llguidance's compile pays for them: it checks
each pair of names for an overlap (two regexes one key may match: "can't determine if
patternProperty regexes ... overlap" past its budget), reading both names' expressions, so its
compile grows as the names times their bytes, not as the schema's bytes. Measured (llguidance
1.9.1, idle, ``schema_problem``'s CPU, the walk of the patterns it never reaches included):
names of 5 bytes, 100 0.05-0.4 s, 200 0.8-6.7 s, 400 25-63 s; 64 names of 144 bytes sharing
their first 140 (580,608 bytes read by the pairs) 0.72 s (7.2 s at load ~14), 32 of 104 (103,168)
0.22 s, 64 of 28 (112,896) 0.25 s; 10 of 1,104 refused by llguidance itself."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .schema_counts import STATES_PER_CHAR, counted_weight

# patternProperties' names in one object, whatever their length
MOST_PATTERN_NAMES = 100
# bytes llguidance's overlap check of one object's names reads: (names - 1) x their ``_weight``. The
# schema's bytes are bounded (``pattern_chars``), but 64 names of 9,216 bytes in all read 580,608
MOST_PAIR_BYTES = 100_000
_ESCAPES_AND_CLASSES = re.compile(r"\\.|\[(?:\\.|[^\]])*\]", re.DOTALL)  # (a "\." or "[.]" reads one character)


def pair_bytes(names: Iterable[str]) -> int:
    """What llguidance's overlap check of ``names`` (one object's patternProperties) reads:
    each name's ``_weight`` once for every other name."""
    sizes = list(map(_weight, names))
    return (len(sizes) - 1) * sum(sizes) if sizes else 0


def _weight(name: str) -> int:
    """A name's UTF-8 bytes, each "." (any character: UTF-8's states) ``STATES_PER_CHAR``, or the
    states its counts build if more: read by the bytes alone, 99 names ``^.{12}x00$`` (97,020) were
    admitted and cost ``schema_problem`` 1.08 s of CPU, ``^.....x00$`` 0.41 s (64 of 144 bytes, refused: 0.29 s)."""
    dots = _ESCAPES_AND_CLASSES.sub("", name).count(".")
    spelled = len(name.encode("utf-8", "surrogatepass")) + (STATES_PER_CHAR - 1) * dots
    return max(spelled, counted_weight(name) * STATES_PER_CHAR)


def names_problem(node: dict) -> str | None:
    """Why llguidance's compile of ``node``'s patternProperties' names costs more than is
    enforced (None: it does not): more of them than ``MOST_PATTERN_NAMES``, or names whose
    pairs read more than ``MOST_PAIR_BYTES``."""
    if not isinstance(named := node.get("patternProperties"), dict):
        return None
    if len(named) > MOST_PATTERN_NAMES:
        return f"an object of {len(named):,} patternProperties: at most {MOST_PATTERN_NAMES} in one can be enforced"
    if (read := pair_bytes(named)) > MOST_PAIR_BYTES:
        return (
            f"an object of {len(named):,} patternProperties whose names weigh {read // (len(named) - 1):,} bytes "
            f"(UTF-8; a '.' or a counted character {STATES_PER_CHAR}): llguidance checks each pair of names for an "
            f"overlap, {read:,} bytes read ((names - 1) x their weight), at most {MOST_PAIR_BYTES:,} can be enforced "
            "(fewer names, or shorter ones)"
        )
    return None
