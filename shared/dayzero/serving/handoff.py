"""KV handoff transports behind one interface: ``publish`` on prefill, ``receive`` on decode.

``shm``: the prefill worker's pools live in a shared-memory segment; decode attaches to it
by name and copies the blocks (same host). ``cuda_ipc``: the pools live in one CUDA
allocation; decode opens its IPC handle and copies device to device (same GPU host).
``redis``: prefill packs the sequence's blocks into a Redis key with a TTL; decode fetches
them (prefill and decode on different hosts). Whichever, the StateRef carries the layout
hash; a mismatch is refused, never copied.
"""

from __future__ import annotations

import json
import struct
from multiprocessing import shared_memory

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from ..kv.handoff import LayoutMismatch, StateHandle, copy_state, export_state, ids_bytes, import_state
from ..kv.pools import KVPools
from ..kv.shared import CudaSharedPools, SharedPools
from ..shm import SHM_DIR
from .lifecycle import Lifecycle
from .messages import StateRef
from .parked import elsewhere, is_this_host, park, this_host


def pack_state(pools: KVPools, seq_id: str) -> bytes:
    """One sequence's state as safetensors bytes (no pickle: whoever can write Redis must not run code
    in decode): a carrier pool holding only its blocks, its block counts and handle in the metadata."""
    handle = export_state(pools, seq_id)
    carrier = KVPools.sized(pools.layout, max(handle.length, 1), 1, pools.dtype)
    import_state(carrier, pools, handle, "s")
    own = export_state(carrier, "s")
    tables = {kind: ids.tolist() for kind, ids in own.blocks.items()}
    header = {"blocks": carrier.blocks, "pool_id": own.pool_id, "length": own.length, "tables": tables}
    tensors = {f"t{i}": t.contiguous() for i, t in enumerate(carrier.tensors())}
    return save(tensors, metadata={"dayzero_state": json.dumps(header), "layout_hash": own.layout_hash})


def unpack_state(data: bytes, like: KVPools) -> tuple[KVPools, StateHandle]:
    try:
        (size,) = struct.unpack("<Q", data[:8])  # safetensors: header length, JSON header, raw buffers
        metadata = json.loads(data[8 : 8 + size])["__metadata__"]
        tensors = load(data)
        header = json.loads(metadata["dayzero_state"])
        stored = iter(tensors[f"t{i}"] for i in range(len(tensors)))
        carrier = KVPools(
            like.layout,
            {kind: int(n) for kind, n in header["blocks"].items()},
            like.dtype,
            allocate=lambda shape, dtype: _checked(next(stored), shape, dtype),
            pool_id=header["pool_id"],
        )
        tables = {kind: tuple(int(b) for b in ids) for kind, ids in header["tables"].items()}
        if (length := int(header["length"])) < 0:  # (as StateRef's: blocks_of counts -1 blocks)
            raise ValueError(f"a state of length {length}")
        return carrier, StateHandle(header["pool_id"], metadata["layout_hash"], length, tables)
    except (KeyError, ValueError, TypeError, StopIteration, struct.error, SafetensorError) as exc:
        raise LayoutMismatch(f"handoff state is not a dayzero state: {exc}") from exc


def _checked(tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
        raise ValueError(f"a pool tensor is {tensor.dtype} {list(tensor.shape)}, expected {dtype} {list(shape)}")
    return tensor


def publish(
    pools: KVPools, seq_id: str, request_id: str, transport: str, store: Lifecycle, ttl_s: float, ids: str = "bytes"
) -> StateRef:
    """``seq_id``'s state for decode; its block ids as ``ids`` says (DAYZERO_HANDOFF_IDS: ``bytes``, or
    ``lists``, which decode workers of a version before ``bytes`` need)."""
    handle = export_state(pools, seq_id)
    counts = pools.layout.blocks_of(handle.length)
    if ids == "bytes":
        blocks, block_ids = {}, ids_bytes(handle.blocks, counts)
    else:
        blocks, block_ids = {kind: tuple(table) for kind, table in handle.blocks.items()}, b""
    location = pools.pool_id  # shm: the segment's name; cuda_ipc: the allocation's IPC handle
    if transport == "cuda_ipc":
        torch.cuda.synchronize(pools.device)  # decode reads from another process: the writes must have landed
    if transport == "redis":
        location = park(store, "kvstate", request_id, pack_state(pools, seq_id), ttl_s)
    return StateRef(
        transport=transport,
        location=location,
        host=this_host(),
        layout_hash=handle.layout_hash,
        dtype=str(pools.dtype).removeprefix("torch."),
        pool_blocks=pools.blocks,
        length=handle.length,
        blocks=blocks,
        block_ids=block_ids,
    )


class Receiver:
    """Decode side: copies a published state into its own pools (caches shm and CUDA attachments)."""

    def __init__(self, store: Lifecycle) -> None:
        self.store = store
        self._attached: dict[str, KVPools] = {}
        self._segments: dict[str, shared_memory.SharedMemory] = {}  # keep the shm mappings open

    def receive(self, ref: StateRef, dst: KVPools, seq_id: str) -> None:
        if ref.layout_hash != dst.layout_hash:
            raise LayoutMismatch(f"prefill state layout {ref.layout_hash} != decode layout {dst.layout_hash}")
        if ref.transport == "redis":
            data = self.store.r.getdel(ref.location)
            if data is None:
                raise LookupError(f"handoff state {ref.location} expired")
            import_state(dst, *unpack_state(data, dst), seq_id)
        else:
            if not is_this_host(ref.host):
                raise elsewhere(f"{ref.transport} state", ref.host, "prefill")
            src = self._attached.get(ref.location)
            if src is None:
                self._detach_swept()
                src = self._attached[ref.location] = self._attach(ref, dst)
            copy_state(dst, src, ref.length, ref.blocks or ref.block_ids, seq_id)  # (attached in dst's layout)
        if ref.transport == "cuda_ipc":
            torch.cuda.synchronize(dst.device)  # prefill may reuse the blocks once the handoff is taken

    def _attach(self, ref: StateRef, dst: KVPools) -> KVPools:
        if ref.transport == "cuda_ipc":
            return CudaSharedPools.attach(ref.location, dst.layout, ref.pool_blocks, dst.dtype)
        try:
            pools, segment = SharedPools.attach(ref.location, dst.layout, ref.pool_blocks, dst.dtype)
        except FileNotFoundError as exc:  # its prefill worker died (and the segment was swept)
            raise LookupError(f"prefill's pool segment {ref.location} is gone") from exc
        self._segments[ref.location] = segment
        return pools

    def _detach_swept(self) -> None:
        """Unmap the attached segments that are gone from /dev/shm: their prefill worker died and its
        successor swept them (a restart publishes a new segment). An unlinked segment's memory stays
        allocated while it is mapped, so each prefill restart would otherwise pin one more pool
        segment in this worker for its whole life."""
        for location in [loc for loc in self._segments if not (SHM_DIR / loc).exists()]:
            self._detach(location)

    def close(self) -> None:
        """Unmap every attached segment."""
        for location in list(self._segments):
            self._detach(location)

    def _detach(self, location: str) -> None:
        self._attached.pop(location, None)  # its tensors hold the mapping's buffer
        segment = self._segments.pop(location)
        try:
            segment.close()
        except BufferError:  # an import still holds a view of it: keep it mapped
            self._segments[location] = segment
