"""Move a sequence's complete attention state from one set of pools to another.

``export_state`` names the blocks (a small handle: pool id, layout hash, length, block ids: lists,
or ``ids_bytes``' int64 bytes, which a message carries faster to parse, copied as they are);
``import_state`` allocates blocks in the destination and copies all four kinds of state:
window ring, compressed entries (CSA and HCA), indexer keys, compressor running state
(across devices when the two pools live on different ones).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .host_copy import copy_host_blocks
from .layout import POOL_KINDS
from .pools import KVPools

# int64 in native order, as the tables' arrays ("q") hold ids: ``ids_bytes`` and ``_plan`` name blocks
# of pools on the same host (np.frombuffer(data, _INT64): ~0.2 us less than dtype=..., a keyword and a name)
_INT64 = np.dtype(np.int64)


class LayoutMismatch(ValueError):
    """Source and destination pools are laid out differently: copying would corrupt state."""


class StateHandle(NamedTuple):  # (a tuple: each handoff makes one, a frozen dataclass's init is 3x the time)
    pool_id: str
    layout_hash: str
    length: int
    blocks: dict[str, Sequence[int]] | bytes  # a sequence's tables (int64 arrays), a message's lists, or ``ids_bytes``'


def ids_bytes(blocks: dict[str, array], counts: dict[str, int]) -> bytes:
    """The first ``counts[kind]`` ids of each kind's table, kind after kind (``POOL_KINDS``' order),
    as int64 (native order: ids as bytes only name blocks on the same host): the ids a state of
    those counts needs, split again by the counts."""
    return b"".join([blocks[kind][: counts[kind]] for kind in POOL_KINDS])


def _split(data: bytes, counts: dict[str, int]) -> dict[str, list[int]]:
    """``ids_bytes``' lists again (the copy between devices takes lists); bytes of another count
    than ``counts``' ids raise ValueError (the lists cut from them could not say: an id more would
    be left out)."""
    if len(data) != 8 * sum(counts.values()):
        raise ValueError(f"{len(data)} bytes of block ids, not 8 for each of the {sum(counts.values())} it needs")
    ids, at, lists = np.frombuffer(data, _INT64).tolist(), 0, {}
    for kind in POOL_KINDS:
        lists[kind], at = ids[at : at + counts[kind]], at + counts[kind]
    return lists


def export_state(pools: KVPools, seq_id: str) -> StateHandle:
    seq = pools.sequences[seq_id]  # (its tables copied: the handle names the blocks of this moment)
    return StateHandle(pools.pool_id, pools.layout_hash, seq.length, {kind: ids[:] for kind, ids in seq.tables.items()})


def import_state(dst: KVPools, src: KVPools, handle: StateHandle, seq_id: str) -> None:
    """Copy the handle's state from ``src`` into new blocks of ``dst`` under ``seq_id``. Block ids
    (a message's) outside the source pool, or fewer than its length needs, raise IndexError (a
    LookupError: decode gives the request back to be re-run), on either path."""
    if handle.pool_id != src.pool_id:
        raise ValueError(f"handle refers to pool {handle.pool_id}, not {src.pool_id}")
    if handle.layout_hash != dst.layout_hash or handle.layout_hash != src.layout_hash:
        raise LayoutMismatch(f"state layout {handle.layout_hash} does not match the destination's {dst.layout_hash}")
    copy_state(dst, src, handle.length, handle.blocks, seq_id)


def copy_state(dst: KVPools, src: KVPools, length: int, blocks: dict[str, Sequence[int]] | bytes, seq_id: str) -> None:
    """``import_state`` past its checks of the handle, for a caller that made them: the state of
    ``length`` tokens in ``src``'s ``blocks`` (as a handle names them) copied into new blocks of
    ``dst``, pools of one layout hash. (Decode's receive: a message's handle was 0.3-0.7 us.)"""
    counts = dst.layout.blocks_of(length)
    held = seq_id in dst.sequences  # (it keeps its blocks, maybe more than ``counts``: the copy takes those)
    tables = dst.hold(seq_id, length, counts).tables
    if held:
        tables = {kind: tables[kind][: counts[kind]] for kind in POOL_KINDS}
    try:  # (host pools: copy_host_blocks checks the plan's length, where ``blocks``' bytes must fit)
        if dst.host_places is not None and src.host_places is not None and dst.dtype == src.dtype:
            copy_host_blocks(dst.host_places, src.host_places, _plan(counts, tables, blocks))
        else:
            _copy_on_devices(dst, src, counts, tables, _split(blocks, counts) if isinstance(blocks, bytes) else blocks)
    except (ValueError, struct.error) as exc:  # fewer ids than its length needs, or one past int64
        raise IndexError(f"the state's block ids do not fit its length or pools ({exc})") from None


def _copy_on_devices(
    dst: KVPools, src: KVPools, counts: dict[str, int], tables: dict[str, array], blocks: dict[str, Sequence[int]]
) -> None:
    """import_state's copy between pools on any devices, kind by kind (``copy_blocks`` checks each
    kind's ids first: on a GPU an id past its pool was a device-side assert, a negative one read
    from the pool's end)."""
    for kind, dst_t, src_t in zip(POOL_KINDS, dst.tensors(), src.tensors(), strict=True):
        if n := counts[kind]:
            copy_blocks(dst_t, src_t, tables[kind][:n], blocks[kind][:n])


def _within(ids: Sequence[int], blocks: int) -> None:
    if ids and not (min(ids) >= 0 and max(ids) < blocks):
        raise IndexError(f"a block id is outside its pool of {blocks}")


def warm_up_host_copy(pools: KVPools) -> None:
    """Compile host pools' copy now (or load it from numba's cache): the first handoff waited on it,
    1-2 s from the cache, ~10 s compiling, on a loaded host. The plan is ``_plan``'s (a read-only
    array: numba compiles another copy for a writable one)."""
    if pools.host_places is not None:
        none = {kind: array("q") for kind in POOL_KINDS}
        copy_host_blocks(pools.host_places, pools.host_places, _plan(dict.fromkeys(POOL_KINDS, 0), none, b""))


_W, _C, _H, _I, _P = POOL_KINDS  # (the plan spelled out: a loop over the kinds took 0.6 us more a handoff)
_FIVE = struct.Struct("=5q")  # (a count or length of each kind)


def _plan(counts: dict[str, int], dst: dict[str, array], src: dict[str, Sequence[int]] | bytes) -> np.ndarray:
    """``copy_host_blocks``' plan: each kind's count, the lengths of each kind's list in ``dst``,
    then in ``src``, then the lists (int64 in native order, the head and a message's lists packed
    so too; unsliced: the copy takes each one's first ``count``). ``dst``'s tables are int64 arrays
    as long as the counts (``copy_state``'s: taken or cut so), joined as they are, their lengths
    the counts' bytes again; ``src`` as ``ids_bytes``' bytes (its lists as long as the counts) too;
    a message's lists are packed (struct: half numpy's time)."""
    c, d = counts, dst
    counted = _FIVE.pack(c[_W], c[_C], c[_H], c[_I], c[_P])
    if isinstance(src, bytes):
        src_lengths, src_ids = counted, src
    else:
        s = src
        lengths = len(s[_W]), len(s[_C]), len(s[_H]), len(s[_I]), len(s[_P])
        src_lengths = _FIVE.pack(*lengths)
        src_ids = struct.pack(f"={sum(lengths)}q", *s[_W], *s[_C], *s[_H], *s[_I], *s[_P])
    return np.frombuffer(b"".join((counted, counted, src_lengths, d[_W], d[_C], d[_H], d[_I], d[_P], src_ids)), _INT64)


def _stretch(ids: Sequence[int]) -> bool:
    """Whether ``ids`` count up by one (one or two ids: their ends say it)."""
    n, first = len(ids), ids[0]
    return ids[-1] - first == n - 1 and (n < 3 or list(ids) == list(range(first, first + n)))


def copy_blocks(dst: torch.Tensor, src: torch.Tensor, dst_ids: Sequence[int], src_ids: Sequence[int]) -> None:
    """dst[:, dst_ids] = src[:, src_ids] for pool tensors [layers, blocks, ...] on any devices and of
    any dtypes: one strided copy when both id lists count up by one, else one gather into a
    contiguous buffer and one scatter (``host_copy`` is its compiled twin for host pools). Lists of
    two lengths raise ValueError, an id outside its pool IndexError, before anything is copied."""
    if len(dst_ids) != len(src_ids):
        raise ValueError(f"{len(dst_ids)} destination blocks for {len(src_ids)} source blocks")
    _within(dst_ids, dst.shape[1])
    _within(src_ids, src.shape[1])
    if _stretch(src_ids) and _stretch(dst_ids):
        n, at, start = len(src_ids), dst_ids[0], src_ids[0]
        dst[:, at : at + n].copy_(src[:, start : start + n])
    else:
        src_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
        dst_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
        dst.index_copy_(1, dst_idx, src.index_select(1, src_idx).to(dst.device, dst.dtype))
