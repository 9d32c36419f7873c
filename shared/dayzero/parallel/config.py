"""How a model is split: ``ParallelConfig`` and the sizes that must divide by it.

Tensor parallel == expert parallel, as in DeepSeek's reference: rank r of N owns query heads,
output groups, indexer heads, shared-expert rows, vocabulary rows ``[r*n/N, (r+1)*n/N)`` of
each, and routed experts ``[r*E/N, (r+1)*E/N)``; everything else is replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig


class ParallelError(ValueError):
    """A model that cannot be split over the ranks asked for; the message names the field."""


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ParallelError(f"rank {self.rank} of {self.world_size} ranks")

    def part(self, n: int) -> int:
        """This rank's share of ``n`` (already checked to divide)."""
        return n // self.world_size

    def span(self, n: int) -> tuple[int, int]:
        """[start, stop) of this rank's share of ``n`` items."""
        size = self.part(n)
        return self.rank * size, (self.rank + 1) * size


def split_fields(cfg: ModelConfig) -> dict[str, int]:
    """The config.json fields whose sizes are split over the ranks."""
    return {
        "num_attention_heads": cfg.num_heads,
        "o_groups": cfg.o_groups,
        "index_n_heads": cfg.index_n_heads,
        "n_routed_experts": cfg.n_routed_experts,
        "moe_intermediate_size": cfg.moe_intermediate_size,  # the shared expert, by its hidden rows
        "vocab_size": cfg.vocab_size,
    }


def check_divisible(cfg: ModelConfig, world_size: int) -> None:
    """Refuse, before anything is read, a config whose split sizes ``world_size`` does not divide."""
    if world_size < 1:
        raise ParallelError(f"tensor parallel size must be at least 1, got {world_size}")
    for name, n in split_fields(cfg).items():
        if n % world_size:
            raise ParallelError(f"{name} {n} cannot be split over {world_size} ranks")
