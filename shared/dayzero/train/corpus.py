"""The training text: Python's reference-manual topics (``pydoc_data.topics``), split 95/5.

Each topic is cut into pieces of about ``PIECE_CHARS`` characters at paragraph boundaries;
the 5% of pieces whose seeded hash of (topic, piece index) is lowest are held out. The split
depends on the seed only, never on the order pieces are visited.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

PIECE_CHARS = 2000
HELD_OUT_PERCENT = 5


@dataclass(frozen=True, slots=True)
class Piece:
    topic: str  # the topics dict's key
    index: int  # position of the piece within its topic
    text: str


@dataclass(frozen=True, slots=True)
class Split:
    train: tuple[Piece, ...]
    held_out: tuple[Piece, ...]


def topics() -> dict[str, str]:
    """The reference manual's topics, ~465 KB of English (ships with CPython)."""
    from pydoc_data.topics import topics as table

    return dict(sorted(table.items()))


def pieces(topic: str, text: str, size: int = PIECE_CHARS) -> list[Piece]:
    """``text`` cut after whole paragraphs once a piece reaches ``size`` characters."""
    out: list[str] = []
    current = ""
    for paragraph in text.split("\n\n"):
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= size:
            out.append(current)
            current = ""
    if current.strip():
        out.append(current)
    return [Piece(topic, i, t) for i, t in enumerate(out)]


def _rank(piece: Piece, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}:{piece.topic}:{piece.index}".encode()).digest()


def split(seed: int = 0) -> Split:
    """All pieces of all topics, each in exactly one of train / held_out (in corpus order)."""
    every = [p for topic, text in topics().items() for p in pieces(topic, text)]
    ranked = sorted(every, key=lambda p: _rank(p, seed))
    chosen = {(p.topic, p.index) for p in ranked[: round(len(every) * HELD_OUT_PERCENT / 100)]}
    return Split(
        train=tuple(p for p in every if (p.topic, p.index) not in chosen),
        held_out=tuple(p for p in every if (p.topic, p.index) in chosen),
    )
