"""Move a sequence's complete attention state from one set of pools to another.

``export_state`` names the blocks (a small handle: pool id, layout hash, length, block ids);
``import_state`` allocates blocks in the destination and copies all four kinds of state:
window ring, compressed entries (CSA and HCA), indexer keys, compressor running state
(across devices when the two pools live on different ones).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    layout = src.layout
    window_src, window_dst = list(handle.blocks["window"]), seq.tables["window"]
    dst.window[:, window_dst] = src.window[:, window_src].to(dst.device, dst.window.dtype)
    for pool in GROWING_POOLS:
        n = layout.blocks_for(pool, handle.length)
        if n:
            blocks = src.compressed[pool][:, list(handle.blocks[pool][:n])]
            dst.compressed[pool][:, seq.tables[pool][:n]] = blocks.to(dst.device)
    if handle.blocks["compressor"]:
        src_slot, dst_slot = handle.blocks["compressor"][0], seq.tables["compressor"][0]
        for name, tensor in src.compressor.items():
            dst.compressor[name][:, dst_slot] = tensor[:, src_slot].to(dst.device)
