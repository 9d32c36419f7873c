"""Per-step batch metadata, built once and passed to every layer (plan, then run)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..config import ModelConfig, RopeConfig
from .rope import RopeTable, inv_freq


@lru_cache(maxsize=16)
def _freqs(rope: RopeConfig, dim: int) -> torch.Tensor:
    return inv_freq(rope, dim)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Packed tokens of several sequences, sequence ``s`` at rows ``spans[s]``.

    token_ids [T] long, positions [T] long (absolute positions in each sequence).
    rope_main / rope_compress: cos/sin at ``positions``; freqs_compress [rope_dim/2]
    for the compressors' entry positions.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    spans: tuple[tuple[int, int], ...]
    rope_main: RopeTable
    rope_compress: RopeTable
    freqs_compress: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def last_rows(self) -> torch.Tensor:
        """[B] row of each sequence's last token."""
        return torch.tensor([off + n - 1 for off, n in self.spans], dtype=torch.long)


def plan_step(cfg: ModelConfig, starts: list[int], chunks: list[list[int]], device: torch.device) -> StepPlan:
    """Sequence ``s`` feeds ``chunks[s]`` (non-empty) starting at position ``starts[s]``."""
    spans, offset, positions = [], 0, []
    for start, chunk in zip(starts, chunks, strict=True):
        if not chunk:
            raise ValueError("every sequence in a step needs at least one token")
        spans.append((offset, len(chunk)))
        positions.append(torch.arange(start, start + len(chunk)))
        offset += len(chunk)
    pos = torch.cat(positions).to(device)
    ids = torch.tensor([t for chunk in chunks for t in chunk], dtype=torch.long, device=device)
    main = _freqs(cfg.rope_main, cfg.rope_head_dim).to(device)
    compress = _freqs(cfg.rope_compress, cfg.rope_head_dim).to(device)
    return StepPlan(ids, pos, tuple(spans), RopeTable.at(main, pos), RopeTable.at(compress, pos), compress)
