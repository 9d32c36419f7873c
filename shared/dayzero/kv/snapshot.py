"""The pool rows a speculative step may overwrite, kept so rejected drafts can be undone.

A verify pass writes positions ``start..end-1`` of each sequence (its pending token and its
drafts); if only ``start..keep-1`` are accepted the rows of ``keep..end-1`` must read as
they did before: the window ring slots they overwrote (still needed by later queries), the
compressor buffer rows of those positions, and, where a rejected row closed a compressor
window, the CSA overlap and the entry it emitted (compressed KV, indexer keys). The MTP
layer's window rows from ``start`` on are provisional too (a further draft wrote them).
The kept rows' own state stays as the step wrote it: a step of a few tokens per sequence
leaves every new row in its compressor buffer (``model.compressor``), so nothing is re-run.
"""

from __future__ import annotations

from .layout import GROWING_POOLS, PoolLayout
from .pools import KVPools

_BUFFERS = {"csa": ("csa_kv", "csa_gate", "index_kv", "index_gate"), "hca": ("hca_kv", "hca_gate")}
_OVERLAPS = ("csa_overlap_kv", "csa_overlap_gate", "index_overlap_kv", "index_overlap_gate")


def _rates(layout: PoolLayout) -> dict[str, int]:
    """Rate of each compressor family the model has."""
    rates = {"csa": layout.csa_rate} if layout.csa_layers else {}
    return rates | ({"hca": layout.hca_rate} if layout.hca_layers else {})


class Snapshot:
    """Rows of ``seq_ids`` at positions ``starts[s]..ends[s]-1``, taken before a step writes them
    (their blocks must be reserved up to ``ends[s]``); at most one window per compressor rate.
    Every sequence's rows are taken, and put back, at once: one gather (scatter) per pool tensor."""

    def __init__(self, pools: KVPools, seq_ids: list[str], starts: list[int], ends: list[int]) -> None:
        if any(e - s > r for s, e in zip(starts, ends, strict=True) for r in _rates(pools.layout).values()):
            raise ValueError("a step may span at most one compressor window")
        self.pools, self.ends = pools, ends
        bs, seqs = pools.layout.block_size, [pools.sequences[s] for s in seq_ids]
        self.slots = [seq.tables["compressor"][0] for seq in seqs]
        # every saved position as (sequence index, position), sequence by sequence
        self.at = [(i, p) for i, (s, e) in enumerate(zip(starts, ends, strict=True)) for p in range(s, e)]
        tables = [seqs[i].tables["window"] for i, _ in self.at]
        ring = [p % (len(table) * bs) for table, (_, p) in zip(tables, self.at, strict=True)]
        self.ring = [t[slot // bs] for t, slot in zip(tables, ring, strict=True)], [slot % bs for slot in ring]
        self.window = pools.window[:, self.ring[0], self.ring[1]]  # [window layers, P, head_dim] (a copy)
        self.buffers = {}  # compressor buffer rows of the positions [layers, P, width]
        for family, rate in _rates(pools.layout).items():
            slots, rows = self._buffer_rows(range(len(self.at)), rate)
            self.buffers |= {name: pools.compressor[name][:, slots, rows] for name in _BUFFERS[family]}
        csa = pools.layout.csa_layers
        self.overlaps = {name: pools.compressor[name][:, self.slots] for name in _OVERLAPS} if csa else {}
        self.entries = {}  # pool: (the (sequence, position) closing each entry, (blocks, rows), [layers, n, dim])
        for pool in GROWING_POOLS:
            rate = pools.layout.rate(pool)
            if not pools.layout.entries(pool, 1 << 40):
                continue
            closing = [(i, p) for i, p in self.at if p % rate == rate - 1]
            entries = [(seqs[i].tables[pool], p // rate) for i, p in closing]
            blocks = [table[e // bs] for table, e in entries], [e % bs for _, e in entries]
            self.entries[pool] = (closing, blocks, pools.compressed[pool][:, blocks[0], blocks[1]])

    def _buffer_rows(self, saved: range | list[int], rate: int) -> tuple[list[int], list[int]]:
        """(slot, buffer row) of the saved positions ``saved`` (indices into ``self.at``)."""
        return [self.slots[self.at[j][0]] for j in saved], [self.at[j][1] % rate for j in saved]

    def restore(self, keeps: list[int]) -> None:
        """Sequence ``s`` keeps its positions before ``keeps[s]``: the rows of later positions, and
        what a window they closed changed, read as before the step. The MTP layer's window is put
        back from each start on in any case."""
        pools, main = self.pools, self.pools.layout.num_layers
        later = [j for j, (i, p) in enumerate(self.at) if p >= keeps[i]]
        if later:
            blocks, rows = self.ring
            pools.window[:main, [blocks[j] for j in later], [rows[j] for j in later]] = self.window[:main, later]
            for family, rate in _rates(pools.layout).items():
                slots, buffer_rows = self._buffer_rows(later, rate)
                for name in _BUFFERS[family]:
                    pools.compressor[name][:, slots, buffer_rows] = self.buffers[name][:, later]
        pools.window[main:, self.ring[0], self.ring[1]] = self.window[main:]
        if self.overlaps:  # a CSA window that a rejected row closed: the overlap before it
            rate = pools.layout.csa_rate
            undone = [i for i, end in enumerate(self.ends) if end // rate > keeps[i] // rate]
            for name, value in self.overlaps.items():
                pools.compressor[name][:, [self.slots[i] for i in undone]] = value[:, undone]
        for pool, (closing, (blocks, rows), value) in self.entries.items():
            back = [n for n, (i, p) in enumerate(closing) if p >= keeps[i]]
            if back:
                pools.compressed[pool][:, [blocks[n] for n in back], [rows[n] for n in back]] = value[:, back]
