"""Blocks of one pool handed out and back (a free list), and a sequence's block tables.

Block ids live in int64 arrays (``array("q")``), free lists and tables alike: taking, giving back
and growing a table are slice copies, and a table is already the int64 bytes a handoff's compiled
copy reads (no per-id conversion: a 4k demo state has ~150 ids).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from .layout import POOL_KINDS


class OutOfBlocks(RuntimeError):
    """The pools cannot hold the request now (retry later) or ever (``permanent``)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class BlockAllocator:
    def __init__(self, total: int) -> None:
        self.total = total
        self._free = array("q", range(total - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> array:
        free = self._free
        if n > len(free):
            raise OutOfBlocks(f"need {n} blocks, {len(free)} free")
        if n <= 0:
            if n < 0:  # (free[: -n - 1 : -1] of n = -1 is every block but one)
                raise ValueError(f"cannot allocate {n} blocks")
            return array("q")
        taken = free[: -n - 1 : -1]  # the last n, last first
        del free[-n:]
        return taken

    def release(self, blocks: array) -> None:
        self._free.extend(blocks[::-1])


def take(allocators: dict[str, BlockAllocator], need: dict[str, int], tokens: int) -> dict[str, array]:
    """``need[kind]`` blocks of each kind, all or nothing: where one pool has too few, the blocks
    taken go back as they were (no count of the free blocks first) and OutOfBlocks says ``tokens``;
    so do they where a count is refused (below 0)."""
    taken = {}
    try:
        for kind, n in need.items():
            taken[kind] = allocators[kind].alloc(n)
    except (OutOfBlocks, ValueError) as exc:
        for kind, blocks in taken.items():
            allocators[kind].release(blocks)
        if isinstance(exc, ValueError):
            raise
        raise OutOfBlocks(f"no free blocks for {tokens} tokens now") from None
    return taken


@dataclass(slots=True)
class SequenceBlocks:
    length: int = 0
    tables: dict[str, array] = field(default_factory=lambda: {kind: array("q") for kind in POOL_KINDS})
    room: int = 0  # the longest length its blocks hold (a decode step's reservation compares to it)
