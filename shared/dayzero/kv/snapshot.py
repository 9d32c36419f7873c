"""The pool rows a speculative step may overwrite, kept so rejected drafts can be undone.

A verify pass writes positions ``start..end-1`` of each sequence (its pending token and its
drafts); if only ``start..keep-1`` are accepted the rows of ``keep..end-1`` must read as
they did before: the window ring slots they overwrote (still needed by later queries), the
compressor buffer rows of those positions, and, when a rejected row closed a compressor
window, the CSA overlap and the entry it emitted (compressed KV, indexer keys). The MTP
layer's window rows from ``start`` on are provisional too (a further draft wrote them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import GROWING_POOLS, PoolLayout
from .pools import KVPools

_BUFFERS = {"csa": ("csa_kv", "csa_gate", "index_kv", "index_gate"), "hca": ("hca_kv", "hca_gate")}
_OVERLAPS = ("csa_overlap_kv", "csa_overlap_gate", "index_overlap_kv", "index_overlap_gate")


def _rates(layout: PoolLayout) -> dict[str, int]:
    """Rate of each compressor family the model has."""
    rates = {"csa": layout.csa_rate} if layout.csa_layers else {}
    return rates | ({"hca": layout.hca_rate} if layout.hca_layers else {})


def closes_window(layout: PoolLayout, keep: int, end: int) -> bool:
    """Whether one of the positions ``keep..end-1`` completes a compressor window."""
    return any(end // r > keep // r for r in _rates(layout).values())


@dataclass(slots=True)
class _Rows:
    """One sequence's saved rows."""

    start: int
    end: int
    window: torch.Tensor  # [window layers, end - start, head_dim] ring rows of the positions
    buffers: dict[str, torch.Tensor]  # compressor buffer rows of the positions [layers, end - start, width]
    overlaps: dict[str, torch.Tensor]  # [csa layers, rate, dim]
    entries: dict[str, tuple[list[int], torch.Tensor]]  # entries the positions could close, [layers, n, dim]


class Snapshot:
    """Rows of ``seq_ids`` at positions ``starts[s]..ends[s]-1``, taken before a step writes them
    (their blocks must be reserved up to ``ends[s]``); at most one window per compressor rate."""

    def __init__(self, pools: KVPools, seq_ids: list[str], starts: list[int], ends: list[int]) -> None:
        if any(e - s > r for s, e in zip(starts, ends, strict=True) for r in _rates(pools.layout).values()):
            raise ValueError("a step may span at most one compressor window")
        self.pools = pools
        self.rows = [self._take(seq, s, e) for seq, s, e in zip(seq_ids, starts, ends, strict=True)]
        self.seq_ids = seq_ids

    def _ring(self, seq: str, positions: range) -> tuple[list[int], list[int]]:
        bs = self.pools.layout.block_size
        table = self.pools.sequences[seq].tables["window"]
        slots = [p % (len(table) * bs) for p in positions]
        return [table[slot // bs] for slot in slots], [slot % bs for slot in slots]

    def _entries(self, seq: str, pool: str, start: int, end: int) -> tuple[list[int], list[int]]:
        rate, bs = self.pools.layout.rate(pool), self.pools.layout.block_size
        table = self.pools.sequences[seq].tables[pool]
        closing = [p // rate for p in range(start, end) if p % rate == rate - 1]
        return [table[e // bs] for e in closing], [e % bs for e in closing]

    def _take(self, seq: str, start: int, end: int) -> _Rows:
        pools, positions = self.pools, range(start, end)
        blocks, rows = self._ring(seq, positions)
        slot = pools.sequences[seq].tables["compressor"][:1]
        buffers, overlaps, entries = {}, {}, {}
        for family, rate in _rates(pools.layout).items():
            for name in _BUFFERS[family]:
                buffers[name] = pools.compressor[name][:, slot[0], [p % rate for p in positions]].clone()
        if pools.layout.csa_layers:
            overlaps = {name: pools.compressor[name][:, slot[0]].clone() for name in _OVERLAPS}
        for pool in GROWING_POOLS:
            if pools.layout.entries(pool, end):
                at = self._entries(seq, pool, start, end)
                entries[pool] = (at, pools.compressed[pool][:, at[0], at[1]].clone())
        return _Rows(start, end, pools.window[:, blocks, rows].clone(), buffers, overlaps, entries)

    def restore(self, index: int, keep: int) -> None:
        """Sequence ``seq_ids[index]`` keeps positions before ``keep``: the rows of later positions
        read as before the step (``keep == start``: the whole state as before the step). The MTP
        layer's window is put back from ``start`` on in any case."""
        saved, pools, seq = self.rows[index], self.pools, self.seq_ids[index]
        cut, main = keep - saved.start, pools.layout.num_layers
        blocks, rows = self._ring(seq, range(keep, saved.end))
        pools.window[:main, blocks, rows] = saved.window[:main, cut:]
        mtp_blocks, mtp_rows = self._ring(seq, range(saved.start, saved.end))
        pools.window[main:, mtp_blocks, mtp_rows] = saved.window[main:]
        slot = pools.sequences[seq].tables["compressor"][:1]
        for family, rate in _rates(pools.layout).items():
            for name in _BUFFERS[family]:
                pools.compressor[name][:, slot[0], [p % rate for p in range(keep, saved.end)]] = saved.buffers[name][
                    :, cut:
                ]
        if keep > saved.start:
            return
        for name, value in saved.overlaps.items():
            pools.compressor[name][:, slot[0]] = value
        for pool, ((blocks, rows), value) in saved.entries.items():
            pools.compressed[pool][:, blocks, rows] = value
