"""Move a sequence's complete attention state from one set of pools to another.

``export_state`` names the blocks (a small handle: pool id, layout hash, length, block ids);
``import_state`` allocates blocks in the destination and copies all four kinds of state:
window ring, compressed entries (CSA and HCA), indexer keys, compressor running state
(across devices when the two pools live on different ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .layout import POOL_KINDS
from .pools import KVPools

Storage = torch.Tensor | np.ndarray


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
    dst.reserve(seq_id, handle.length)  # (a sequence it holds already keeps its blocks)
    seq = dst.sequences[seq_id]
    seq.length = handle.length
    same_host = dst.host_bytes is not None and src.host_bytes is not None and dst.dtype == src.dtype
    dst_storage, src_storage = (dst.host_bytes, src.host_bytes) if same_host else (dst.tensors(), src.tensors())
    counts = dst.layout.blocks_of(handle.length)
    for kind, dst_t, src_t in zip(POOL_KINDS, dst_storage, src_storage, strict=True):
        if n := counts[kind]:
            copy_blocks(dst_t, src_t, seq.tables[kind][:n], handle.blocks[kind][:n])


def _stretch(ids: Sequence[int]) -> bool:
    """Whether ``ids`` count up by one (one or two ids: their ends say it)."""
    n, first = len(ids), ids[0]
    return ids[-1] - first == n - 1 and (n < 3 or list(ids) == list(range(first, first + n)))


def copy_blocks(dst: Storage, src: Storage, dst_ids: Sequence[int], src_ids: Sequence[int]) -> None:
    """dst[:, dst_ids] = src[:, src_ids] for pool tensors [layers, blocks, ...] (any devices and
    dtypes) or host pools' bytes: one strided copy when both id lists count up by one (what a
    fresh allocator hands out), else one gather into a contiguous buffer and one scatter."""
    if _stretch(src_ids) and _stretch(dst_ids):
        n, at, start = len(src_ids), dst_ids[0], src_ids[0]
        if isinstance(dst, np.ndarray):  # (an assignment: np.copyto costs ~1.4 us more a call)
            dst[:, at : at + n] = src[:, start : start + n]
        else:
            dst[:, at : at + n].copy_(src[:, start : start + n])
    elif isinstance(dst, np.ndarray):
        dst[:, list(dst_ids)] = src[:, list(src_ids)]
    else:
        src_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
        dst_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
        dst.index_copy_(1, dst_idx, src.index_select(1, src_idx).to(dst.device, dst.dtype))
