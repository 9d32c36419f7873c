"""The only place the ranks talk to each other: ``all_reduce_sum`` and ``all_gather`` (the forward),
``broadcast`` (rank 0's plans to the others, dayzero.parallel.wire).

A ``Group`` of one rank returns its input untouched and counts nothing, so the single-rank
forward is the same code and pays nothing. A larger group reduces in fp32 (as DeepSeek's
reference reduces its row-parallel outputs) over the torch.distributed group it was given,
and counts each call and the seconds spent in it (for bench/parallel.py). ``device``: where this
rank's weights, pools and collective buffers live (cuda:LOCAL_RANK under NCCL, else the CPU).
A collective that fails (a rank died, or stopped answering within the process group's timeout)
raises ``GroupFailed``: the group cannot go on, whatever the step was.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist

from .config import ParallelConfig


class GroupFailed(RuntimeError):
    """A collective failed: another rank died or stopped answering. The group is finished."""


class Group:
    def __init__(
        self,
        config: ParallelConfig | None = None,
        process_group: object | None = None,
        device: torch.device | str = "cpu",
        diagnose: Callable[[], str | None] = lambda: None,
    ) -> None:
        config = config or ParallelConfig()
        if config.world_size > 1 and process_group is None:
            raise ValueError(f"{config.world_size} ranks need a torch.distributed process group")
        self.config, self.process_group, self.device = config, process_group, device
        self.diagnose = diagnose  # after a failed collective: what else is gone, said in GroupFailed's message
        self.counts: Counter[str] = Counter()
        self.seconds = 0.0

    @property
    def size(self) -> int:
        return self.config.world_size

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x`` (same shape on each), in fp32, returned in ``x``'s dtype."""
        if self.size == 1:
            return x
        start = time.perf_counter()
        total = x.to(torch.float32, copy=True).contiguous()  # the caller's tensor is left as is
        self._call(dist.all_reduce, total, group=self.process_group)
        self._count("all_reduce", start)
        return total.to(x.dtype)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order."""
        if self.size == 1:
            return x
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._call(dist.all_gather, parts, x.contiguous(), group=self.process_group)
        self._count("all_gather", start)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` on every rank (written into ``x`` on the others; contiguous, on ``device``)."""
        if self.size > 1:
            self._call(dist.broadcast, x, src=0, group=self.process_group)
        return x

    def _call(self, collective, *args, **kwargs) -> None:
        try:
            collective(*args, **kwargs)
        except RuntimeError as exc:  # gloo / NCCL: a peer's connection closed, or the timeout passed
            also = self.diagnose()
            raise GroupFailed(f"{collective.__name__} failed: {exc}{f'; {also}' if also else ''}") from exc

    def _count(self, name: str, start: float) -> None:
        self.counts[name] += 1
        self.seconds += time.perf_counter() - start
