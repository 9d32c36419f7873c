"""The ragged-batch description every kernel takes: packed tokens of several sequences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Backend = Literal["torch", "triton"]


@dataclass(frozen=True, slots=True)
class RaggedBatch:
    """Sequence ``s`` owns packed rows ``[row0[s], row0[s] + new[s])`` at positions from ``start[s]``.

    seq_of_token [T] int32, positions [T] int32, start / row0 / new [B] int32.
    ``starts`` / ``row0s`` / ``news`` are the same values as Python ints for the torch twins.
    """

    seq_of_token: torch.Tensor
    positions: torch.Tensor
    start: torch.Tensor
    row0: torch.Tensor
    new: torch.Tensor
    starts: tuple[int, ...]
    row0s: tuple[int, ...]
    news: tuple[int, ...]

    @staticmethod
    def build(starts: list[int], news: list[int], device: torch.device | str = "cpu") -> RaggedBatch:
        row0s, offset = [], 0
        for n in news:
            row0s.append(offset)
            offset += n
        seq_of = torch.repeat_interleave(torch.arange(len(news), dtype=torch.int32), torch.tensor(news))
        positions = torch.cat([torch.arange(s, s + n, dtype=torch.int32) for s, n in zip(starts, news, strict=True)])

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        return RaggedBatch(
            seq_of.to(device),
            positions.to(device),
            ints(starts),
            ints(row0s),
            ints(news),
            tuple(starts),
            tuple(row0s),
            tuple(news),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.news)

    def rows(self, s: int) -> slice:
        return slice(self.row0s[s], self.row0s[s] + self.news[s])
