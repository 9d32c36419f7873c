"""The characters llguidance's lexer counts out, one state or more each, for a grammar's string
lexemes: a string's ``minLength``, a regular expression's ``{n}`` / ``{n,m}`` (a group's times what
it counts itself: ``(.{100}){60}`` is 6,000). Its states are the grammar's, not a lexeme's: built
as a reply walks each lexeme and kept, a second lexeme's add to the first's (one lexeme seen again,
an array's items, reuses its own). So a minLength of 3,000 and another of 2,900, each within a
lexeme's bound, were ~5,900 characters counted together, and every reply writing both failed past
llguidance's 50,000 states (``parser_limits``) ~5,560 bytes in: a 400 after a 200 stream began."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from .schema_classes import CASELESS, QUANTIFIER, class_end, escape_end, posix_spelled
from .schema_splits import (
    MOST_AFTER_UNBOUNDED,
    MOST_AFTER_UNBOUNDED_CALLS,
    MOST_AFTER_UNBOUNDED_CLOSED,
    MOST_SPLITS,
    counted_after_unbounded,
    most_after_unbounded,
    split_ways,
)

# characters the counts of one request's grammar may spell, in all: llguidance's lexer builds ~9
# states a character counted (a string's character, ``.``: UTF-8's bytes) under ``parser_limits``'
# 50,000 (5,553 at most, the rest of the grammar's lexemes sharing them). Past it, one count is
# refused, or the counts together; a maxLength past it is clamped to it (``as_llguidance``)
MOST_COUNTED_CHARS = 4_000
# a count told as it or more: a larger one is no more refused, and Python reads no number of over
# 4,300 digits (``a{99...9}``) nor writes one (counts multiplied: ``(((a{99..}){99..})...)``: 500s)
MOST_TOLD = 10**12
# lexer states a counted character builds: 9 for most (any UTF-8 character, a literal one: each an
# own state and its mask's walk grows with the literal, ``a{6000}`` 0.4 s of a reply's steps), 1 for a
# class of ASCII characters ([a-z], \d, \w: ASCII in llguidance's regexes; measured, llguidance 1.9:
# ``.{n}`` fails at byte 5,554, ``[a-z]{n}`` at 49,985 of the 50,000, a reply of [a-z]{6000} walked
# in 0.06 s); a ninth of a character counted
STATES_PER_CHAR, NARROW_STATES = 9, 1
# a class of ASCII characters only (none negated, nor \s, \p, \W, \D, \S: they hold others; nor
# \x{..}, \u: [\x{10000}-\x{10FFFF}]{30000} failed a reply 33,319 bytes in; \x00-\x7F are ASCII)
_NARROW_CLASS = re.compile(r"\[(?!\^)\]?(?:\\(?:x[0-7][0-9A-Fa-f]|(?![WDSsPpxuU])[!-~])|[ -\[\^-~])*\]")
_NARROW_ESCAPES = ("d", "w")  # \d, \w: [0-9], [A-Za-z0-9_] in llguidance's regexes


def counted_repeats(regex: str) -> int:
    """The characters ``regex``'s counts spell: each count's larger bound times what it repeats (a
    character, or a group's own counted characters if any), added up over the pieces (an
    alternation's branches too: the lexer's states hold every branch)."""
    return _counted(regex, weigh=False)


def counted_weight(regex: str) -> int:
    """``counted_repeats`` as the lexer's states weigh them, in characters of ``STATES_PER_CHAR``:
    a repeated class of ASCII characters a ninth of one (``^[a-z]{6000}$``: 667)."""
    return -(-_counted(regex, weigh=True) // STATES_PER_CHAR)


def _counted(regex: str, weigh: bool) -> int:
    groups = [0]  # counted characters (or states) of each group open, innermost last
    last = added = 0  # what the piece just read repeats (a character's weight; a group's count), and added of it
    wide, most = (STATES_PER_CHAR, MOST_TOLD * STATES_PER_CHAR) if weigh else (1, MOST_TOLD)
    # a ninth only for a class counted outside any group: within a counted one its states multiply
    # ((\d{1,2}){18000}, 4,000 weighed so: "too many expressions" 2,227 bytes into a reply)
    # (case-insensitive: (?i)[a-z] holds the Kelvin sign and the long s: 30,000 failed 16,663 bytes in)
    narrow = weigh and not CASELESS.search(regex)
    i = 0
    while i < len(regex):
        char = regex[i]
        if char == "{" and (count := QUANTIFIER.match(regex, i)):
            groups[-1] += max(_bound(count[1]), _bound(count[2] or "0")) * last - added
            last, i = 0, count.end()
            continue
        last, added = wide, 0
        if char == "(":
            groups.append(0)
            last = 0
        elif char == ")" and len(groups) > 1:
            added = groups.pop()
            groups[-1] += added
            last = added or wide  # (a group counting nothing itself: a character)
        elif char == "[":
            end = class_end(regex, i)  # (a POSIX class by what it holds: [[:alpha:]] is [A-Za-z])
            spelled = posix_spelled(regex[i:end]) if narrow and len(groups) == 1 else None
            last = NARROW_STATES if spelled is not None and _NARROW_CLASS.fullmatch(spelled) else wide
            i = end - 1
        elif char == "\\":  # (one character: \x{800}'s digits its code, not a count)
            narrow_escape = narrow and len(groups) == 1 and regex[i + 1 : i + 2] in _NARROW_ESCAPES
            last, i = NARROW_STATES if narrow_escape else wide, escape_end(regex, i) - 1
        elif char in "|*+?^$":
            last = 0
        i += 1
    return min(sum(groups), most)


def _bound(digits: str) -> int:
    return int(digits) if len(digits) < len(str(MOST_TOLD)) else MOST_TOLD


class CountedChars:
    """The counts of one request's schemas (one grammar), each distinct lexeme's once."""

    def __init__(self) -> None:
        self._seen: set[tuple] = set()
        self.total = 0
        self._after_unbounded = 0  # the longest run past MOST_AFTER_UNBOUNDED_WIDE (within the closed bound)

    def problem(self, node: dict) -> str | None:
        """A count of ``node`` past ``MOST_COUNTED_CHARS`` alone, or with the counts seen before it
        (None: none): its minLength, or its regular expressions' counts (a reply could never be written
        whole), or their counted groups of varying length past ``MOST_SPLITS`` (``schema_splits``), or
        a count after a repeat without bound of its characters past ``MOST_AFTER_UNBOUNDED``. A
        maxLength past it is clamped instead (``as_llguidance``: shorter still satisfies it)."""
        most, low = MOST_COUNTED_CHARS, node.get("minLength")
        repeats = ((regex, counted_weight(regex)) for regex in regexes(node))
        counts = [(("regex", r), n, _counting(r, n)) for r, n in repeats if n]
        if (low := as_number(low)) is not None and low > 0:
            lexeme = ("string", string_lexeme(node))
            counts.append((lexeme, low, f"minLength {low:,}"))
        for lexeme, count, what in counts:
            if count > most:
                return f"{what}: at most {most:,} characters counted in one can be enforced"
            if lexeme not in self._seen:
                self._seen.add(lexeme)
                self.total += count
            if self.total > most:
                together = f"{self.total:,} characters counted with the request's other counts"
                return f"{what}: {together}, at most {most:,} in all can be enforced (one grammar's lexer holds them)"
        if (ways := sum(map(split_ways, regexes(node)))) > MOST_SPLITS:
            why = f"its repeats split a reply's text {_told(ways)} ways, at most {MOST_SPLITS} can be enforced"
            return f"a regular expression repeating a group of varying length: {why}"
        if (repeats := max(map(counted_after_unbounded, regexes(node)), default=0)) > MOST_AFTER_UNBOUNDED_CLOSED:
            most, opened = MOST_AFTER_UNBOUNDED_CLOSED, MOST_AFTER_UNBOUNDED
            why = (
                f"at most {most:,} can be enforced ({opened:,} in a grammar holding an object open to other properties)"
            )
            return f"{_AFTER_UNBOUNDED}: {_told(repeats)} in a run, {why}"
        self._after_unbounded = max(self._after_unbounded, repeats)
        return None

    def open_problem(self, calls: bool = False) -> str | None:
        """A count after a repeat without bound past what a grammar holding an object open to other
        properties writes (within what a closed one's does: ``problem`` let it through), or None;
        ``calls``: forced calls' grammar, which writes less (``MOST_AFTER_UNBOUNDED_CALLS``)."""
        most = MOST_AFTER_UNBOUNDED_CALLS if calls else MOST_AFTER_UNBOUNDED
        if (repeats := self._after_unbounded) <= most:
            return None
        closed = MOST_AFTER_UNBOUNDED_CLOSED
        where = "in forced tool calls" if calls else "in a grammar holding an object open to other properties"
        where += "" if calls else f" ({closed:,} where every object is closed)"
        return f"{_AFTER_UNBOUNDED}: {_told(repeats)} in a run, at most {most:,} can be enforced {where}"

    def wide_problem(self, count_classes: Callable[[], int]) -> str | None:
        """A count after a repeat without bound past what a grammar whose lexemes tell apart the byte
        classes ``count_classes`` counts (``schema_alphabet``; counted only where a run is past the least
        bound) writes (``most_after_unbounded``), or None."""
        if not (repeats := self._after_unbounded):
            return None
        if repeats <= (most := most_after_unbounded(classes := count_classes())):
            return None
        where = f"in a grammar whose names, values and patterns tell {classes} byte classes apart"
        return f"{_AFTER_UNBOUNDED}: {_told(repeats)} in a run, at most {most:,} can be enforced {where}"


_AFTER_UNBOUNDED = "a regular expression counting characters after a repeat without bound of the same characters"


def string_lexeme(node: dict) -> str:
    """What makes a string schema's lexeme the one it is (the same seen again: the lexer's states reused)."""
    return repr([node.get(k) for k in ("minLength", "maxLength", "pattern", "format")])


def _counting(regex: str, weight: int) -> str:
    ninths = " (a class of ASCII characters counting a ninth)" if weight != counted_repeats(regex) else ""
    return f"a regular expression counting {_told(weight)} repeats{ninths}"


def _told(count: int) -> str:
    return f"{count:,}" if count < MOST_TOLD else f"{MOST_TOLD:,} or more"


def length_cap(groups: Iterable[list[dict]]) -> int | None:
    """The longest ``maxLength`` that the strings of ``groups`` (one grammar's schemas, in groups
    llguidance merges into one: ``merged_groups``) may keep so that what a reply may write in them
    stays, together, within ``MOST_COUNTED_CHARS`` (None: as written it does): the lexer counts a
    string's characters up to its maxLength (to its minLength where none: past it, it loops on
    states it has), each distinct lexeme's once, and a regular expression's counted repeats. Bounds
    over the cap are cut to it (each to its group's ``shortest_cut`` at the least); the shorter
    ones are kept. A maxLength of 4,000 and one of 3,999, each within its own bound, let a reply of
    3,000 characters in each fail ~5,560 bytes in."""
    lexemes, fixed = {}, {}
    for group in groups:
        highs = [h for node in group if (h := as_number(node.get("maxLength"))) is not None]
        bounded = bool(highs) or any(as_number(node.get("minLength")) is not None for node in group)
        for node in group:  # (a bounded string's pattern: one lexeme with its bounds, counted there)
            fixed.update(
                (regex, counted_weight(regex))
                for regex in regexes(node)
                if not bounded or regex is not node.get("pattern")
            )
        if bounded:
            key = tuple(sorted(map(string_lexeme, group)))
            low = group_floor(group)
            lexemes[key] = (low, max(low, *highs) if highs else low)

    def counted(cap: float) -> float:
        return sum(fixed.values()) + sum(min(high, max(low, cap)) for low, high in lexemes.values())

    if counted(float("inf")) <= MOST_COUNTED_CHARS:
        return None
    fits, over = 0, MOST_COUNTED_CHARS + 1  # counted(fits) within (or the least there is), counted(over) past
    while over - fits > 1:
        middle = (fits + over) // 2
        fits, over = (middle, over) if counted(middle) <= MOST_COUNTED_CHARS else (fits, middle)
    return fits


def shortest_cut(node: dict) -> float:
    """The least a string's maxLength is cut to: its minLength, and what its pattern counts (cut
    under it, ``^[0-9]{3000}$`` with a maxLength of 1,000, nothing matched it: llguidance refused
    the schema, "Unable to determine if regex is empty")."""
    pattern = node.get("pattern")
    return max(as_number(node.get("minLength")) or 0, counted_repeats(pattern) if isinstance(pattern, str) else 0)


def group_floor(group: list[dict]) -> float:
    """The least the maxLengths of ``group`` (schemas merged into one) are cut to: the most any of
    them needs (``shortest_cut``; an allOf's minLength of 3,000 beside a maxLength of 3,500 cut to
    1,000: "Unsatisfiable schema", the schema refused)."""
    return max(map(shortest_cut, group), default=0)


def as_number(value: object) -> float | None:
    """``value`` if a JSON number (None: not one, a bool neither)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def regexes(node: dict) -> list[str]:
    """``node``'s regular expressions: its pattern, its patternProperties' names."""
    pattern, named = node.get("pattern"), node.get("patternProperties")
    return ([pattern] if isinstance(pattern, str) else []) + list(named if isinstance(named, dict) else ())
