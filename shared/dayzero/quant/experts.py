"""FP4 experts kept packed; routed experts dequantized on demand.

Each MoE call dequantizes only the experts its tokens route to, into a workspace whose
slots are reused by every layer (its size follows the most experts one call routes to,
never the number of layers). A byte-budgeted LRU cache keeps the hottest dequantized
experts; budget 0 disables it. Counters feed the metrics endpoint.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch
from torch import nn

from .. import kernels
from ..kernels.batch import Backend
from ..kernels.expert_mlp import expert_mlp
from .formats import dequant_mxfp4


@dataclass(slots=True)
class ExpertCounters:
    conversions: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    packed_bytes: int = 0
    workspace_bytes: int = 0
    cache_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class PackedExperts(nn.Module):
    """w1 / w3 [E, I, H/2] int8 with scales [E, I, H/32]; w2 [E, H, I/2] with scales [E, H, I/32]."""

    def __init__(self, n: int, hidden: int, inter: int) -> None:
        super().__init__()
        for name, (rows, cols) in {"w1": (inter, hidden), "w2": (hidden, inter), "w3": (inter, hidden)}.items():
            self.register_buffer(name, torch.empty(n, rows, cols // 2, dtype=torch.int8))
            self.register_buffer(f"{name}_scale", torch.empty(n, rows, cols // 32, dtype=torch.uint8))
        self.converter: ExpertConverter | None = None  # installed by the loader
        self.layer = -1

    def packed_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def run(self, xs: torch.Tensor, counts: torch.Tensor, most: int, limit: float, backend: Backend) -> torch.Tensor:
        """The MoE's RoutedExperts: the grouped MXFP4 kernel on a GPU, else the hit experts
        dequantized through the converter (workspace + cache)."""
        if backend == "triton":
            return kernels.expert_mlp_mxfp4(xs, counts, most, dict(self.named_buffers()), limit, backend)
        return expert_mlp(xs, counts.tolist(), lambda ids: self.converter.weights(self, ids), limit)


class ExpertConverter:
    def __init__(self, cache_budget_bytes: int, dtype: torch.dtype) -> None:
        self.budget, self.dtype = cache_budget_bytes, dtype
        self.counters = ExpertCounters()
        self._cache: OrderedDict[tuple[int, int], tuple[torch.Tensor, ...]] = OrderedDict()
        self._workspace: list[tuple[torch.Tensor, ...]] = []

    def _slot(self, i: int, shapes: list[torch.Size], device: torch.device) -> tuple[torch.Tensor, ...]:
        while len(self._workspace) <= i:
            slot = tuple(torch.empty(s, dtype=self.dtype, device=device) for s in shapes)
            self._workspace.append(slot)
            self.counters.workspace_bytes += sum(t.numel() * t.element_size() for t in slot)
        return self._workspace[i]

    def weights(self, experts: PackedExperts, ids: list[int]) -> dict[int, tuple[torch.Tensor, ...]]:
        """Dequantized (w1, w2, w3) of each expert in ``ids`` for this call."""
        out, free_slot = {}, 0
        shapes = [
            torch.Size((*experts.w1.shape[1:-1], experts.w1.shape[-1] * 2)),
            torch.Size((*experts.w2.shape[1:-1], experts.w2.shape[-1] * 2)),
            torch.Size((*experts.w3.shape[1:-1], experts.w3.shape[-1] * 2)),
        ]
        for e in ids:
            key = (experts.layer, e)
            if key in self._cache:
                self._cache.move_to_end(key)
                self.counters.cache_hits += 1
                out[e] = self._cache[key]
                continue
            self.counters.cache_misses += 1
            self.counters.conversions += 1
            slot = self._slot(free_slot, shapes, experts.w1.device)
            free_slot += 1
            for dest, name in zip(slot, ("w1", "w2", "w3"), strict=True):
                dest.copy_(dequant_mxfp4(getattr(experts, name)[e], getattr(experts, f"{name}_scale")[e]))
            out[e] = slot
            self._remember(key, slot)
        return out

    def _remember(self, key: tuple[int, int], slot: tuple[torch.Tensor, ...]) -> None:
        size = sum(t.numel() * t.element_size() for t in slot)
        if size > self.budget:
            return
        while self.counters.cache_bytes + size > self.budget:
            _, evicted = self._cache.popitem(last=False)
            self.counters.cache_bytes -= sum(t.numel() * t.element_size() for t in evicted)
        self._cache[key] = tuple(t.clone() for t in slot)
        self.counters.cache_bytes += size
