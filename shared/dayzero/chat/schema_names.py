"""The names of an object's patternProperties, as llguidance's compile pays for them: it checks
each pair of names for an overlap (two regexes one key may match: "can't determine if
patternProperty regexes ... overlap" past its budget), reading both names' expressions, so its
compile grows as the names times their bytes, not as the schema's bytes. Measured (llguidance
1.9.1, idle, ``schema_problem``'s CPU, the walk of the patterns it never reaches included):
names of 5 bytes, 100 0.05-0.4 s, 200 0.8-6.7 s, 400 25-63 s; 64 names of 144 bytes sharing
their first 140 (580,608 bytes read by the pairs) 0.72 s (7.2 s at load ~14), 32 of 104 (103,168)
0.22 s, 64 of 28 (112,896) 0.25 s; 10 of 1,104 refused by llguidance itself."""

from __future__ import annotations

from collections.abc import Iterable

# patternProperties' names in one object, whatever their length
MOST_PATTERN_NAMES = 100
# bytes llguidance's overlap check of one object's names reads: (names - 1) x their UTF-8 bytes. The
# schema's bytes are bounded (``pattern_chars``), but 64 names of 9,216 bytes in all read 580,608
MOST_PAIR_BYTES = 100_000


def pair_bytes(names: Iterable[str]) -> int:
    """What llguidance's overlap check of ``names`` (one object's patternProperties) reads:
    each name's UTF-8 bytes once for every other name."""
    sizes = [len(name.encode("utf-8", "surrogatepass")) for name in names]
    return (len(sizes) - 1) * sum(sizes) if sizes else 0


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
            f"an object of {len(named):,} patternProperties whose names spell {read // (len(named) - 1):,} bytes "
            f"(UTF-8): llguidance checks each pair of names for an overlap, {read:,} bytes read ((names - 1) x "
            f"their bytes), at most {MOST_PAIR_BYTES:,} can be enforced (fewer names, or shorter ones)"
        )
    return None
