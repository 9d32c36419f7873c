"""The ragged-batch description every kernel takes: packed tokens of several sequences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch

Backend = Literal["torch", "triton"]
T = TypeVar("T")


def from_host(values: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """Step metadata built with numpy on the host, on ``device`` (a torch op per small tensor costs
    several times a numpy one). To a GPU it goes from pinned memory without waiting: a copy from
    pageable memory synchronises the stream (torch's memcpy_and_sync), a dozen times a step."""
    tensor, kind = torch.from_numpy(values), torch.device(device).type
    if kind == "cpu":  # there already (``.to`` would return it, as one more aten op: 16 a demo decode step)
        return tensor
    if kind != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)  # (pinned: held until the copy is done)


def kept_view(owner: object, name: str, viewed: tuple[torch.Tensor, ...], make: Callable[[], T]) -> T:
    """``make()`` (views of the tensors ``viewed``), made once and kept on ``owner`` as ``name`` with
    the addresses it views: made afresh when one of them was given new memory (``param.data = ...``,
    a move); in-place changes show through the views kept."""
    at = tuple(tensor.data_ptr() for tensor in viewed)
    kept = owner.__dict__.get(name)
    if kept is None or kept[0] != at:
        kept = owner.__dict__[name] = at, make()
    return kept[1]


def dot_side(n: int) -> int:
    """A tile side covering ``n`` rows or columns of a tensor-core dot: the next power of two, at
    least 16 (what Triton's dots take on a GPU)."""
    return max(16, 1 << (n - 1).bit_length())


ROW_TILE = 4096  # elements a program of a row-wise kernel holds at most (its rows x the padded width)


@dataclass(frozen=True, slots=True)
class RowTile:
    """A row-wise kernel's program (rope, the RMS norms): ``rows`` consecutive rows of ``side``
    channels (the width's next power of two), at most ``ROW_TILE`` elements unless one row is wider,
    over ``warps`` warps. One program a row cost Triton's interpreter (the CPU tests) ~3 ms each,
    a tiny model's query of 12 tokens x 4 heads 48 of them. The tile depends on the width alone, not
    on how many rows a call has: a row's RMS sum is added in the same order whatever the batch (a
    tile shrunk to a call's rows changed the warps, and with them a 1024-wide row's sum order on
    sm_90, between one token and four), and a width compiles once."""

    rows: int
    side: int
    warps: int

    @staticmethod
    def of(width: int, per_thread: int) -> RowTile:
        """For rows of ``width`` channels, ``per_thread`` elements a thread (at most 16 warps)."""
        side = 1 << (width - 1).bit_length()
        block = max(1, ROW_TILE // side)
        return RowTile(block, side, min(16, max(1, block * side // (32 * per_thread))))


@dataclass(frozen=True, slots=True)
class RaggedBatch:
    """Sequence ``s`` owns packed rows ``[row0[s], row0[s] + new[s])`` at positions from ``start[s]``.

    seq_of_token [T] int32, positions [T] int32, start / row0 / new [B] int32.
    ``starts`` / ``row0s`` / ``news`` are the same values as Python ints for the torch twins;
    ``host_seq`` / ``host_positions`` are ``seq_of_token``'s and ``positions``' values as the builder
    made them (numpy int32 on the host: a step's window metadata reads them, no tensor read).
    """

    seq_of_token: torch.Tensor
    positions: torch.Tensor
    start: torch.Tensor
    row0: torch.Tensor
    new: torch.Tensor
    starts: tuple[int, ...]
    row0s: tuple[int, ...]
    news: tuple[int, ...]
    host_seq: np.ndarray
    host_positions: np.ndarray

    @staticmethod
    def build(starts: list[int], news: list[int], device: torch.device | str = "cpu") -> RaggedBatch:
        """Built on the host with numpy (``from_host``)."""
        new = np.asarray(news, dtype=np.int32)
        start = np.asarray(starts, dtype=np.int32)
        row0 = np.cumsum(new, dtype=np.int32) - new
        seq_of = np.repeat(np.arange(len(news), dtype=np.int32), new)
        positions = np.arange(int(new.sum()), dtype=np.int32) + np.repeat(start - row0, new)
        return RaggedBatch(
            from_host(seq_of, device),
            from_host(positions, device),
            from_host(start, device),
            from_host(row0, device),
            from_host(new, device),
            tuple(starts),
            tuple(row0.tolist()),
            tuple(news),
            seq_of,
            positions,
        )

    @property
    def num_seqs(self) -> int:
        return len(self.news)

    def rows(self, s: int) -> slice:
        return slice(self.row0s[s], self.row0s[s] + self.news[s])
