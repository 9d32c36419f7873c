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
from dataclasses import dataclass, field

from .schema_classes import CASELESS, characters, class_end

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
# open one: ``.*.{1300}`` 1,115 in, as the open one's own)
MOST_AFTER_UNBOUNDED, MOST_AFTER_UNBOUNDED_CLOSED = 1_000, 1_500
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")  # {n}, {n,}, {n,m}
# an escape of one character: \x{10000}, \x61, \u0061, \U00000061, \p{L}, \pL (read a character a
# backslash, ``(\pL|..){1900}`` was lengths [2, 2], let through: every reply failed 332 bytes in)
_ESCAPE = re.compile(r"\\(?:[xuUpP]\{[^}]*\}|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[pP].|.)", re.DOTALL)
_FLAGS = re.compile(r"[A-Za-z-]*")  # (?flags) and (?flags:...): i, x, -x, ...
_MOST_ATOMS_READ = 64  # atoms one regex reads the characters of, at most (4,000 distinct: 0.6 s)
_MOST_DIGITS = 12  # a count of more is read as 10^12 (Python reads no number of over 4,300 digits)


@dataclass(slots=True)
class _Group:
    branches: list[tuple[float, float]] = field(default_factory=list)  # finished branches' [lo, hi]
    sequence: tuple[float, float] = (0, 0)  # the branch being read, but its last atom
    last: tuple[float, float] | None = None  # the last atom's [lo, hi] (None: none a count may repeat)
    text: str | None = None  # the last atom's text, a character's (None: a group's)
    verbose: bool = False  # under the x flag: whitespace and # comments are no characters
    # the atoms (their texts) repeated without bound: before the atom read in the branch being read
    # (its groups' too), and in the finished branches
    unbounded: set[str | None] = field(default_factory=set)
    unbounded_branches: set[str | None] = field(default_factory=set)
    outer: frozenset[str | None] = frozenset()  # the enclosing groups' (live in this branch: ``outer_live``)
    outer_live: bool = True
    caseless: bool = False
    read: set[str | None] = field(default_factory=set)  # the atoms whose characters were read (all groups')
    # the expressions the last atom builds its lexer written after a repeat without bound of characters
    # it shares: a character's count of it (1 uncounted), a group's repeats times its own counted run
    # (``(.{100}){20}``: 2,000; ``(ab){1200}``: 1,200, its "a" and "b" told apart); whether counted
    weight: float = 1
    counted: bool = False
    # their sum in this branch's run after a repeat without bound (the most of any run: ``after``, of
    # counted atoms only: ``after_counted``); a character of none of them, not optional, ends the run
    tail: tuple[float, float] = (0, 0)
    after: float = 0
    after_counted: float = 0
    # read for the group repeated: the texts of its atoms of one character (its nested groups' too),
    # what a branch counts before its first repeat without bound (``head``; the most of any branch:
    # ``heads``), and the runs its branches end in after one still live (``tails``)
    atoms: set[str] = field(default_factory=set)
    head: float = 0
    head_done: bool = False
    heads: float = 0
    head_atoms: set[str | None] = field(default_factory=set)  # (all branches')
    tails: float = 0
    live_at_end: set[str | None] = field(default_factory=set)
    # the last atom's, a group's: (``tails``, ``heads``) where its next repeat goes on a run (``wrapped``)
    wraps: tuple[float, float] = (0, 0)
    # the last atom's, a group's: its ``heads`` and ``head_atoms`` (``((.{1600}.*)){2}``: the outer's head)
    lead: float = 0
    lead_atoms: set[str | None] = field(default_factory=set)

    def add(self, atom: tuple[float, float] | None) -> None:
        """Read ``atom`` after the last one (None: an anchor, a quantifier's end)."""
        if self.last is not None:
            self.sequence = (self.sequence[0] + self.last[0], self.sequence[1] + self.last[1])
            self._follow(*self.last)
            if not self.head_done and self.last[1] == math.inf:
                self.head, self.head_atoms = self.head + self.lead, self.head_atoms | self.lead_atoms
            self.head_done = self.head_done or self.last[1] == math.inf
            if not self.head_done:
                self.head += self.last[1]
                self.head_atoms.add(self.text)
        self.last = atom

    def end_branch(self) -> None:
        """Note what the branch read ends in (``heads``, ``tails``, ``live_at_end``), before the next."""
        self.add(None)
        self.heads = max(self.heads, self.head)
        if self.unbounded:
            self.tails, self.live_at_end = max(self.tails, self.tail[0]), self.live_at_end | self.unbounded
        self.head, self.head_done = 0, False

    def wrapped(self) -> tuple[float, float]:
        """Where the group's next repeat goes on a run after a repeat without bound ((0, 0): it does
        not): what a branch ends in after one still live (``tails``), and what a branch counts before
        its first (``heads``), read by it (``(.{2000}.*){2}``: (0, 2,000); a second repeat reads the
        run on: 2,000, ``.*.{2000}``'s; a read of none: ``(.*){1900}`` none, ``(a.*){2}`` 1)."""
        if (
            not self.live_at_end
            or not self.heads
            or not _group_shares(self.head_atoms, self.live_at_end, self.caseless)
        ):
            return 0, 0
        return self.tails, self.heads

    def _follow(self, lo: float, hi: float) -> None:
        """Count the last atom, of ``lo``-``hi`` characters, into the run after a repeat without bound."""
        before = self.unbounded | (self.outer if self.outer_live else frozenset())
        if not before:
            return
        if _shared(self.text, before, self.caseless, self.read):
            self.tail = (self.tail[0] + self.weight, self.tail[1] + self.weight * self.counted)
            self.after, self.after_counted = max(self.after, self.tail[0]), max(self.after_counted, self.tail[1])
        elif lo >= 1:  # (``[a-z]*-[a-z]{2000}``: past its "-", no repeat reads on: written whole)
            self.unbounded, self.outer_live, self.tail = set(), False, (0, 0)

    def lengths(self) -> tuple[float, float]:
        self.end_branch()
        branches = [*self.branches, self.sequence]
        return min(lo for lo, _ in branches), max(hi for _, hi in branches)


def _run_repeated(wraps: tuple[float, float], repeats: float) -> float:
    """The run after a group's first repeat without bound, the group repeated ``repeats`` times (at
    least twice; ``wraps``: ``_Group.wrapped``'s): its tail, then the head and tail of each repeat more."""
    tails, heads = wraps
    return tails + _times(repeats - 1, heads + tails) if heads and repeats >= 2 else 0


def _group_shares(atoms: set[str | None], live: set[str | None], caseless: bool) -> bool:
    """Whether ``atoms`` read a character of the repeats ``live`` (past ``_MOST_ATOMS_READ``: taken as so)."""
    if len(atoms) > _MOST_ATOMS_READ:
        return True
    return any(_reads_of(atom, frozenset(live), caseless) for atom in atoms)


def _group_text(atoms: set[str]) -> str | None:
    """A group's text as one character it reads, any of its ``atoms`` (None: any character)."""
    return "(?:" + "|".join(sorted(atoms)) + ")" if atoms and len(atoms) <= _MOST_ATOMS_READ else None


def split_ways(regex: str) -> int:
    """The ways ``regex``'s counted groups of varying length split a reply's text among their
    repeats, added up (see the module's docstring); 0 where none varies."""
    return _read(regex)[0]


def counted_after_unbounded(regex: str) -> int:
    """The most characters ``regex`` counts in a run after a repeat without bound that may read the
    same characters (its own branch's, or an enclosing group's, before it): a count its repeats, a
    group counted its repeats times its own counted run, all that follows added up till a character
    no repeat reads (not optional) ends it; of those past ``MOST_AFTER_UNBOUNDED`` (0: none):
    ``.*.{2000}`` 2,000, ``.*.{1000}.{1000}`` 2,000 (one count's alone was read: let through, every
    reply failed 1,560 characters in), ``.*(ab){1200}`` 1,200, ``[a-z]*[0-9]{2000}`` and
    ``[a-z]*-[a-z]{2000}`` 0 (the "-" ends it; refused, though written whole)."""
    return _read(regex)[1]


def counts_unbounded_group(regex: str) -> bool:
    """Whether ``regex`` counts repeats of a group that repeats without bound within (``(a+){50}``)."""
    return _read(regex)[2]


@functools.lru_cache(maxsize=256)
def _read(regex: str) -> tuple[int, int, bool]:
    groups, ways, after, i = [_Group(caseless=bool(CASELESS.search(regex)))], 0, 0, 0
    unbounded_counted = False  # a count of a group repeating without bound (``(a+){50}``)
    while i < len(regex):
        char, top = regex[i], groups[-1]
        if top.verbose and (char.isspace() or char == "#"):  # ((?x)(. |..){1900}: [2, 2] read, no ways)
            line_end = regex.find("\n", i) if char == "#" else i + 1
            i = line_end if line_end >= 0 else len(regex)
            continue
        if char == "{" and (count := _QUANTIFIER.match(regex, i)):
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
            groups.append(_Group(verbose=top.verbose, outer=outer, caseless=top.caseless, read=top.read))
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
            groups[-1].text, groups[-1].counted = _group_text(top.atoms), bool(top.after_counted)
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
                i = _ESCAPE.match(regex, i).end() - 1 if i + 1 < len(regex) else i
            top.add((1, 1))
            top.text, top.weight, top.counted, top.wraps = regex[start : i + 1], 1, False, (0, 0)
            top.lead = 0
            top.atoms.add(top.text)
        i += 1
    for group in groups:  # (its end, and groups left open)
        group.add(None)
        after = max(after, group.after)
    return ways, int(after) if after > MOST_AFTER_UNBOUNDED else 0, unbounded_counted


def _shared(atom: str | None, before: set[str | None], caseless: bool, read: set[str | None]) -> bool:
    """Whether ``atom`` may read a character one of the atoms repeated without bound ``before`` it
    reads (``characters``); past ``_MOST_ATOMS_READ`` atoms ``read`` in one regex, taken as so (each
    read costs Python a regex's compile: ``.*`` before 790 classes each of its own, 0.1 s)."""
    read.add(atom)
    read |= before
    return len(read) > _MOST_ATOMS_READ or _reads_of(atom, frozenset(before), caseless)


@functools.lru_cache(maxsize=4096)
def _reads_of(atom: str | None, before: frozenset[str | None], caseless: bool) -> bool:
    """Whether ``atom`` may read a character one of ``before`` reads (``(a|.*|b).`` 400 times: each
    atom's read once, 0.32 s -> 0.1 s of 5 such patterns, load 10)."""
    return bool(characters(atom, caseless) & frozenset().union(*(characters(t, caseless) for t in before)))


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
