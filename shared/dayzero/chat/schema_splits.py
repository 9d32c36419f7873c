"""The ways llguidance's lexer holds at once to split a reply's text among a counted group's
repeats, where the group's own length varies: ``^(.{1,2}){1900}$`` counts 3,800 characters, within
``MOST_COUNTED_CHARS``, but after k characters written its lexer holds every count of repeats done
(k/2 to k) with every offset within the one begun, and builds each anew at every step: its fuel
(``parser_limits``' ``step_lexer_fuel``) ran out 1,106 characters in ("too many expressions
constructed"), a broken stream after a 200. Measured (llguidance 1.9, the gateway's limits): a
group of lengths [lo, hi] fails where ``written * (1/lo - 1/hi) * (hi - lo + 1)`` reaches ~800-1,100
(``(.{1,2})`` 1,106 characters in, ``(.{1,3})`` 505, ``(.{2,3})`` 2,445, ``(.{1,20})`` 55, ``(.+)``
858; UTF-8's é as many characters); written at most ``repeats * hi``, that is
``repeats * (hi - lo) * (hi - lo + 1) / lo`` ways (``(.+){n}``: n). In an open object
(additionalProperties) its lexer fails sooner, at ~550-740 (``(.{1,2})`` 736 characters in,
``(.{1,3})`` 335, ``(.{2,3})`` 1,635, ``(.{1,20})`` 39, ``(.+)`` 565); the largest counts written
whole there: ``(.{1,2}){724}`` 1,448 ways, ``(.{1,3}){335}`` 2,010, ``(.{2,3}){800}`` 800 (900
fail), so ``MOST_SPLITS`` holds, 200 ways short of the nearest; but ``(.+){n}`` fails from 580
repeats (565 characters in; 560 written whole), its ways let through to 600: a repeat of a group
without bound weighs 6/5 of a way (500 at most)."""

from __future__ import annotations

import functools
import math
import re

from .schema_classes import CASELESS, QUANTIFIER, class_end, escape_end
from .schema_groups import Group, group_text

# ways a regular expression's counted groups may split a reply's text among their repeats, in all
# (a count of ~800 failed the lexer first: ``(.{2,3}){1000}``, 3,000 characters, writes whole at 667)
MOST_SPLITS = 600
# characters counted in a run after a repeat without bound of characters they share: past some, each
# character written builds its lexer a branch more (``.*.{2000}``: ``.*.{2000} | .{1999} | ...``).
# Measured (llguidance 1.9, the gateway's limits), a reply written on past the count: in a closed
# object ``.*.{n}`` is written whole to n = 1,550 and fails 1,558 characters in from 1,600 (``a*.{n}``
# 1,512 in from 1,550; ``.*a{2000}``, ``.*-.{2000}``, ``(.*)x{2000}`` ~1,515); in an open one
# (additionalProperties) sooner: ``.*.{1000}`` whole, ``.*.{1200}`` 1,060 in (``\w*\d{2000}``,
# ``[[:alpha:]]*[[:alpha:]]{2000}``, ``.*.{2000,}``, ``.*.{1,2000}`` ~1,060; ``.*(ab){1300}`` 2,125,
# its 1,062nd repeat). None shared, none: ``a*b{2000}``, ``[a-z]*[0-9]{2000}`` written whole
# A grammar holding no object open to other properties (a closed one, a string, an array) writes more:
# ``.*.{1550}`` whole in a closed object, 1,600 at the top or in an array (a closed object beside an
# open one: ``.*.{1300}`` 1,115 in, as the open one's own). The open object's other properties' patterns
# take from it: beside one (``^x[a-z]+$``) ``.*.{1000}`` fails, beside 10 to 160 ``.*.{893}`` does
# (887 whole; beside integers, strings, enums 1,000 is whole), and a closed one's: beside one
# ``.*.{1400}`` fails, beside 40 to 160 ``.*.{1135}`` does (1,127 whole)
MOST_AFTER_UNBOUNDED, MOST_AFTER_UNBOUNDED_CLOSED = 850, 1_100
# forced calls' grammar (tool_calls_grammar: tool_choice named or required, bounded as holding an open
# object) writes less: a parameter's ``.*.{n}`` whole to 852 in a closed object, fails 862 characters
# in from 862 (731 and 737 in an open one; under "auto" 840 / 720); beside other tools holding open
# objects, whatever their own: 671 whole among 8 tools, 660 among 32 and 128 (668 fail)
MOST_AFTER_UNBOUNDED_CALLS = 600
# and every bound above was measured in a grammar whose names, enum and const strings and patterns
# spell few distinct bytes (its lexer's alphabet, a count's digits none: 25, beside ``^x0[a-z]+$`` to
# ``^x39[a-z]+$``). Each byte more it tells apart takes from them: a closed object of 30 common
# property names, 4 formats and an enum wrote ``.*.{534}`` whole (open: 525; every reply past ~535
# characters failed, ``.*.{600}`` admitted under each bound); beside 22 common names (49 bytes) a
# closed object 709 whole, 725 failed, an open one 646, 662; beside printable ASCII (94) 459 and 451
# whole, beside ASCII and Latin (162) 271 whole, 287 failed; beside 207 bytes (ASCII, UTF-8 of each
# length) 228 whole in a closed object, an open one and a forced call alike, 237 failed. Swept (llguidance
# 1.9.1, 40 points at 77-113 byte classes: printable ASCII, letters and names, Cyrillic, CJK; open and
# closed), the longest run written whole is 49,140-49,856 over the byte classes its lexer tells apart
# (as its log counts them: ``schema_alphabet`` counts the same), the shortest failed 49,680-50,264 over
# them; beside 40 ``^xN[a-z]+$`` (44 classes closed, 57 open) 1,127 and 887 whole (49,588, 50,559),
# beside printable ASCII and UTF-8 of each length (212) 232 whole, open or closed (49,184). So
# ``48,400 / classes`` bounds a run (``most_after_unbounded``: 1.5% under the least written whole),
# never under 200. Counted as the bytes spelled, a pattern's syntax (``^ [ - ] + $``) took from it:
# 756 beside those 40 in an open object, 949 closed
MOST_AFTER_UNBOUNDED_WIDE = 200
_RUN_SCALE = 48_400
_FLAGS = re.compile(r"[A-Za-z-]*")  # (?flags) and (?flags:...): i, x, -x, ...
_MOST_DIGITS = 12  # a count of more is read as 10^12 (Python reads no number of over 4,300 digits)


def _run_repeated(wraps: tuple[float, float], repeats: float) -> float:
    """The run after a group's first repeat without bound, the group repeated ``repeats`` times (at
    least twice; ``wraps``: ``Group.wrapped``'s): its tail, then the head and tail of each repeat more."""
    tails, heads = wraps
    return tails + _times(repeats - 1, heads + tails) if heads and repeats >= 2 else 0


def split_ways(regex: str) -> int:
    """The ways ``regex``'s counted groups of varying length split a reply's text among their
    repeats, added up (see the module's docstring); 0 where none varies."""
    return _read(regex)[0]


def counted_after_unbounded(regex: str) -> int:
    """The most characters ``regex`` counts in a run after a repeat without bound that may read the
    same characters (its own branch's, or an enclosing group's, before it): a count its repeats, a
    group counted its repeats times its own counted run, all that follows added up till a character
    no repeat reads (not optional) ends it; of those past ``MOST_AFTER_UNBOUNDED_WIDE`` (0: none):
    ``.*.{2000}`` 2,000, ``.*.{1000}.{1000}`` 2,000 (one count's alone was read: let through, every
    reply failed 1,560 characters in), ``.*(ab){1200}`` 1,200, ``[a-z]*[0-9]{2000}`` and
    ``[a-z]*-[a-z]{2000}`` 0 (the "-" ends it; refused, though written whole)."""
    return _read(regex)[1]


def counts_unbounded_group(regex: str) -> bool:
    """Whether ``regex`` counts repeats of a group that repeats without bound within (``(a+){50}``)."""
    return _read(regex)[2]


@functools.lru_cache(maxsize=256)
def _read(regex: str) -> tuple[int, int, bool]:
    groups, ways, after, i = [Group(caseless=bool(CASELESS.search(regex)))], 0, 0, 0
    unbounded_counted = False  # a count of a group repeating without bound (``(a+){50}``)
    while i < len(regex):
        char, top = regex[i], groups[-1]
        if top.verbose and (char.isspace() or char == "#"):  # ((?x)(. |..){1900}: [2, 2] read, no ways)
            line_end = regex.find("\n", i) if char == "#" else i + 1
            i = line_end if line_end >= 0 else len(regex)
            continue
        if char == "{" and (count := QUANTIFIER.match(regex, i)):
            repeated = top.last is not None and count[2] == ""  # (without bound: {n,})
            if top.last is not None:
                low = _number(count[1])
                high = low if count[2] is None else _number(count[2]) if count[2] else math.inf
                repeats = high if high < math.inf else low
                ways += _ways(top.last, repeats)
                unbounded_counted = unbounded_counted or top.last[1] == math.inf and repeats > 1
                top.weight, top.counted = _times(top.weight, repeats), True  # (``.{2000,}``: its least)
                after = max(after, _run_repeated(top.wraps, high if high < math.inf else max(low, 2)))
                top.last = (_times(top.last[0], low), _times(top.last[1], high))
            top.add(None)
            if repeated:  # (after it is read: ``.*.{2000,}`` read after ``.*``'s)
                top.unbounded.add(top.text)
            i = count.end()
            continue
        if char == "(":
            outer = top.outer | top.unbounded if top.outer_live else frozenset(top.unbounded)
            groups.append(Group(verbose=top.verbose, outer=outer, caseless=top.caseless, read=top.read))
            if regex.startswith("?", i + 1):  # (?:, (?P<name>: read on past its ":" or ">"; (?i) to its ")"
                ends = [j for j in map(regex.find, ":>)", (i,) * 3) if j >= 0]
                end = min(ends, default=len(regex))
                if _FLAGS.fullmatch(flags := regex[i + 2 : end]) and regex[end : end + 1] in (":", ")"):
                    on, _, off = flags.partition("-")  # (x: for the group (?x:...), or on in this one (?x))
                    (groups[-1] if regex[end] == ":" else top).verbose = "x" in on or top.verbose and "x" not in off
                i = end if regex[end : end + 1] in (":", ">") else end - 1
        elif char == ")" and len(groups) > 1:
            groups.pop()
            lengths = top.lengths()
            after = max(after, top.after)
            groups[-1].add(lengths)
            groups[-1].atoms |= top.atoms
            # (its atoms' characters: ``(b)*a{2000}`` read as any, refused, though written whole)
            groups[-1].text, groups[-1].counted = group_text(top.atoms), bool(top.after_counted)
            groups[-1].wraps = top.wrapped()
            groups[-1].lead, groups[-1].lead_atoms = top.heads, top.head_atoms
            groups[-1].weight = max(1, top.after_counted)
            groups[-1].unbounded |= top.unbounded | top.unbounded_branches  # (``(.*)x{2000}``: after it)
        elif char == "|":
            top.end_branch()
            top.branches.append(top.sequence)
            top.sequence = (0, 0)
            top.unbounded_branches |= top.unbounded
            top.unbounded, top.outer_live, top.tail = set(), True, (0, 0)
        elif char in "*+?":
            repeated = top.last is not None and char != "?"
            if top.last is not None:
                lo, hi = top.last
                top.last = (0 if char != "+" else lo, hi if char == "?" else math.inf)
                after = max(after, _run_repeated(top.wraps, 2 if repeated else 0))
            top.add(None)  # (a lazy or possessive mark after it: nothing to repeat)
            if repeated:
                top.unbounded.add(top.text)
        elif char in "^$":
            top.add(None)
        else:
            start = i
            if char == "[":
                i = class_end(regex, i) - 1
            elif char == "\\":
                i = escape_end(regex, i) - 1
            top.add((1, 1))
            top.text, top.weight, top.counted, top.wraps = regex[start : i + 1], 1, False, (0, 0)
            top.lead = 0
            top.atoms.add(top.text)
        i += 1
    for group in groups:  # (its end, and groups left open)
        group.add(None)
        after = max(after, group.after)
    return ways, int(after) if after > MOST_AFTER_UNBOUNDED_WIDE else 0, unbounded_counted


def most_after_unbounded(classes: int) -> int:
    """The most characters a run after a repeat without bound may count in a grammar whose lexemes
    tell ``classes`` byte classes apart (``schema_alphabet``)."""
    return max(MOST_AFTER_UNBOUNDED_WIDE, _RUN_SCALE // classes)


def _ways(lengths: tuple[float, float], repeats: float) -> int:
    """The ways a group of ``lengths`` [lo, hi] repeated ``repeats`` times splits its text. A least
    of 0 splits as its twin of least 1: ``(.{0,2}){n}`` fails where ``(.{1,2}){n}`` does (largest n
    written whole in an open object: 724 both; ``(.{0,3})`` 327, ``(.{1,3})`` 335), so ``(.?){n}``
    none (``.{0,n}`` to llguidance: 4,000 written whole); counted [0, 2], 6n ways refused ``(.{0,2})``
    from 101 repeats (``(.{0,2}){2000}`` failed 1,112 characters in, ``{1000}`` 742 bytes in)."""
    lo, hi = max(lengths[0], 1), lengths[1]
    if repeats <= 1 or lo >= hi:
        return 0
    if hi == math.inf:  # (6/5 a repeat: ``(.+){600}`` failed an open object's reply 565 characters in)
        return math.ceil(repeats * 6 / 5)
    return math.ceil(repeats * (hi - lo) * (hi - lo + 1) / lo)


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= _MOST_DIGITS else 10**_MOST_DIGITS


def _times(length: float, repeats: float) -> float:
    return length * repeats if length and repeats else 0  # (no 0 * inf)
