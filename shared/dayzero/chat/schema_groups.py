"""A group of a regular expression as ``schema_splits`` reads it, one character or group at a time:
its branches' lengths, the atoms repeated without bound before what it reads, and the run after
them (what llguidance's lexer builds anew at each step past such a repeat: ``schema_splits``'
docstring and ``MOST_AFTER_UNBOUNDED``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .schema_classes import characters

MOST_ATOMS_READ = 64  # atoms one regex reads the characters of, at most (4,000 distinct: 0.6 s)


@dataclass(slots=True)
class Group:
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
        if not self.live_at_end or not self.heads or not group_shares(self.head_atoms, self.live_at_end, self.caseless):
            return 0, 0
        return self.tails, self.heads

    def _follow(self, lo: float, hi: float) -> None:
        """Count the last atom, of ``lo``-``hi`` characters, into the run after a repeat without bound."""
        before = self.unbounded | (self.outer if self.outer_live else frozenset())
        if not before:
            return
        if shared(self.text, before, self.caseless, self.read):
            self.tail = (self.tail[0] + self.weight, self.tail[1] + self.weight * self.counted)
            self.after, self.after_counted = max(self.after, self.tail[0]), max(self.after_counted, self.tail[1])
        elif lo >= 1:  # (``[a-z]*-[a-z]{2000}``: past its "-", no repeat reads on: written whole)
            self.unbounded, self.outer_live, self.tail = set(), False, (0, 0)

    def lengths(self) -> tuple[float, float]:
        self.end_branch()
        branches = [*self.branches, self.sequence]
        return min(lo for lo, _ in branches), max(hi for _, hi in branches)


def group_shares(atoms: set[str | None], live: set[str | None], caseless: bool) -> bool:
    """Whether ``atoms`` read a character of the repeats ``live`` (past ``MOST_ATOMS_READ``: taken as so)."""
    if len(atoms) > MOST_ATOMS_READ:
        return True
    return any(reads_of(atom, frozenset(live), caseless) for atom in atoms)


def group_text(atoms: set[str]) -> str | None:
    """A group's text as one character it reads, any of its ``atoms`` (None: any character)."""
    return "(?:" + "|".join(sorted(atoms)) + ")" if atoms and len(atoms) <= MOST_ATOMS_READ else None


def shared(atom: str | None, before: set[str | None], caseless: bool, read: set[str | None]) -> bool:
    """Whether ``atom`` may read a character one of the atoms repeated without bound ``before`` it
    reads (``characters``); past ``MOST_ATOMS_READ`` atoms ``read`` in one regex, taken as so (each
    read costs Python a regex's compile: ``.*`` before 790 classes each of its own, 0.1 s)."""
    read.add(atom)
    read |= before
    return len(read) > MOST_ATOMS_READ or reads_of(atom, frozenset(before), caseless)


@functools.lru_cache(maxsize=4096)
def reads_of(atom: str | None, before: frozenset[str | None], caseless: bool) -> bool:
    """Whether ``atom`` may read a character one of ``before`` reads (``(a|.*|b).`` 400 times: each
    atom's read once, 0.32 s -> 0.1 s of 5 such patterns, load 10)."""
    return bool(characters(atom, caseless) & frozenset().union(*(characters(t, caseless) for t in before)))
