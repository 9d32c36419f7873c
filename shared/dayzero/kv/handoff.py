"""Move a sequence's complete attention state from one set of pools to another.

``export_state`` names the blocks (a small handle: pool id, layout hash, length, block ids);
``import_state`` allocates blocks in the destination and copies all four kinds of state:
window ring, compressed entries (CSA and HCA), indexer keys, compressor running state
(across devices when the two pools live on different ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .layout import GROWING_POOLS
from .pools import KVPools


class LayoutMismatch(ValueError):
    """Source and destination pools are laid out differently: copying would corrupt state."""


@dataclass(frozen=True, slots=True)
class StateHandle:
    pool_id: str
    layout_hash: str
    length: int
    blocks: dict[str, tuple[int, ...]]


def export_state(pools: KVPools, seq_id: str) -> StateHandle:
    seq = pools.sequences[seq_id]
    return StateHandle(
        pools.pool_id, pools.layout_hash, seq.length, {kind: tuple(ids) for kind, ids in seq.tables.items()}
    )


def import_state(dst: KVPools, src: KVPools, handle: StateHandle, seq_id: str) -> None:
    """Copy the handle's state from ``src`` into new blocks of ``dst`` under ``seq_id``."""
    if handle.pool_id != src.pool_id:
        raise ValueError(f"handle refers to pool {handle.pool_id}, not {src.pool_id}")
    if handle.layout_hash != dst.layout_hash or handle.layout_hash != src.layout_hash:
        raise LayoutMismatch(f"state layout {handle.layout_hash} does not match the destination's {dst.layout_hash}")
    dst.reserve(seq_id, handle.length)
    seq = dst.sequences[seq_id]
    seq.length = handle.length
    for kind, dst_t, src_t in _pairs(dst, src):
        n = src.layout.blocks_for(kind, handle.length)
        if n:
            copy_blocks(dst_t, src_t, seq.tables[kind][:n], handle.blocks[kind][:n])


def _pairs(dst: KVPools, src: KVPools) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(pool kind, destination tensor, source tensor) for every tensor of the state."""
    pairs = [("window", dst.window, src.window)]
    pairs += [(pool, dst.compressed[pool], src.compressed[pool]) for pool in GROWING_POOLS]
    return pairs + [("compressor", dst.compressor[name], t) for name, t in src.compressor.items()]


def _stretch(ids: Sequence[int]) -> bool:
    return list(ids) == list(range(ids[0], ids[0] + len(ids)))


def copy_blocks(dst: torch.Tensor, src: torch.Tensor, dst_ids: Sequence[int], src_ids: Sequence[int]) -> None:
    """dst[:, dst_ids] = src[:, src_ids] for pool tensors [layers, blocks, ...] (any devices and
    dtypes): one strided copy when both id lists count up by one (what a fresh allocator hands
    out), else one gather into a contiguous buffer and one scatter."""
    if _stretch(src_ids) and _stretch(dst_ids):
        n = len(src_ids)
        dst[:, dst_ids[0] : dst_ids[0] + n].copy_(src[:, src_ids[0] : src_ids[0] + n])
        return
    src_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
    dst_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
    dst.index_copy_(1, dst_idx, src.index_select(1, src_idx).to(dst.device, dst.dtype))
