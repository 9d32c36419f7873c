"""Pools whose storage another process can map, so it can read a sequence's blocks: a named
shared-memory segment (the prefill -> decode handoff on CPU) or a CUDA allocation shared by
its IPC handle (on one GPU)."""

from __future__ import annotations

import errno
import json
import math
import os
import uuid
from multiprocessing import resource_tracker, shared_memory

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor
from torch.storage import TypedStorage

from ..shm import POOL, room
from .layout import PoolLayout
from .pools import KVPools

_ALIGN = 64
PREFIX = POOL
Segment = shared_memory.SharedMemory
# what a pool segment leaves free in /dev/shm for the host's other segments: image embeddings parked for
# prefill (a request's 8 images of 256 tokens of V4-Flash's 4096 floats: 32 MiB), two requests' worth
SHM_HEADROOM = 64 << 20


def headroom(total: int) -> int:
    """What a pool leaves free of a /dev/shm of ``total`` bytes: ``SHM_HEADROOM``, or half of a smaller
    one (docker's default 64 MiB: all of it was kept, and no budget, however low, was let in)."""
    return min(SHM_HEADROOM, total // 2)


def shm_fits(size: int, free: int, total: int) -> bool:
    """Whether segments of ``size`` bytes in all fit where ``free`` of ``total`` are free, ``headroom`` left."""
    return size + headroom(total) <= free


class NoShmRoom(MemoryError):
    """A pool segment larger than what /dev/shm has free (less ``headroom``), refused before it is
    created: made, its zeroing would fill the filesystem (a SIGBUS where the pages ran out, and the
    host's other segments failing meanwhile)."""

    def __init__(self, size: int, free: int, total: int) -> None:
        super().__init__(f"a segment of {size} bytes where {free} of {total} are free")
        self.size, self.free, self.total = size, free, total


class _Carver:
    """Hands out consecutive aligned tensors from one byte buffer (or only counts them)."""

    def __init__(self, buffer: torch.Tensor | None = None) -> None:
        self.buffer, self.offset = buffer, 0

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        size = math.prod(shape) * (torch.finfo(dtype).bits // 8)
        start = -(-self.offset // _ALIGN) * _ALIGN
        self.offset = start + size
        if self.buffer is None:
            return torch.empty(shape, dtype=dtype, device="meta")
        return self.buffer[start : start + size].view(dtype).view(shape)


def segment_bytes(layout: PoolLayout, blocks: dict[str, int], dtype: torch.dtype) -> int:
    counter = _Carver()
    KVPools(layout, blocks, dtype, allocate=counter)
    return max(counter.offset, 1)


class SharedPools:
    """Create (owner) or attach to (reader) pools in a shared-memory segment."""

    @staticmethod
    def create(
        layout: PoolLayout, blocks: dict[str, int], dtype: torch.dtype
    ) -> tuple[KVPools, shared_memory.SharedMemory]:
        size, (free, total) = segment_bytes(layout, blocks, dtype), room()
        if not shm_fits(size, free, total):
            raise NoShmRoom(size, free, total)
        name = f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # the creator's pid: see shm.sweep_stale
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        _reserve(shm)
        buffer = torch.frombuffer(shm.buf, dtype=torch.uint8)
        buffer.zero_()
        return KVPools(layout, blocks, dtype, allocate=_Carver(buffer), pool_id=shm.name), shm

    @staticmethod
    def attach(
        name: str, layout: PoolLayout, blocks: dict[str, int], dtype: torch.dtype
    ) -> tuple[KVPools, shared_memory.SharedMemory]:
        shm = shared_memory.SharedMemory(name=name)
        if not name.startswith(f"{PREFIX}-{os.getpid()}-"):  # the creator (another process) owns it:
            resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 - keep ours from unlinking it
        buffer = torch.frombuffer(shm.buf, dtype=torch.uint8)
        return KVPools(layout, blocks, dtype, allocate=_Carver(buffer), pool_id=name), shm


def _reserve(shm: Segment) -> None:
    """Take the new segment's pages now (tmpfs: all or none, ENOSPC where they are not there): the room
    read before it was made may be gone, another worker's segment made meanwhile (``up --prefill 2``:
    both read the room, both zeroed theirs, both died of a SIGBUS); then refused, the segment unlinked."""
    try:
        os.posix_fallocate(shm._fd, 0, shm.size)  # noqa: SLF001 - the segment's own descriptor
    except OSError as exc:
        if exc.errno != errno.ENOSPC:  # (a filesystem without fallocate: its zeroing takes the pages)
            return
        shm.close()
        shm.unlink()
        raise NoShmRoom(shm.size, *room()) from None


class CudaSharedPools:
    """Pools in one CUDA allocation whose IPC handle is the pool id: a process on the same GPU
    attaches by it (CUDA IPC cannot be opened by the process that exported it)."""

    @staticmethod
    def create(layout: PoolLayout, blocks: dict[str, int], dtype: torch.dtype, device: str) -> KVPools:
        buffer = torch.zeros(segment_bytes(layout, blocks, dtype), dtype=torch.uint8, device=device)
        _, args = reduce_tensor(buffer)  # the producer keeps ``buffer`` alive for the worker's life
        fields = dict(zip(_IPC_FIELDS, args[6:], strict=True))
        handle = json.dumps({k: v.hex() if isinstance(v, bytes) else v for k, v in fields.items()})
        return KVPools(layout, blocks, dtype, buffer.device, allocate=_Carver(buffer), pool_id=handle)

    @staticmethod
    def attach(pool_id: str, layout: PoolLayout, blocks: dict[str, int], dtype: torch.dtype) -> KVPools:
        fields = {k: bytes.fromhex(v) if isinstance(v, str) else v for k, v in json.loads(pool_id).items()}
        size = segment_bytes(layout, blocks, dtype)
        buffer = rebuild_cuda_tensor(
            torch.Tensor, torch.Size([size]), (1,), 0, TypedStorage, torch.uint8, *(fields[k] for k in _IPC_FIELDS)
        )
        return KVPools(layout, blocks, dtype, buffer.device, allocate=_Carver(buffer), pool_id=pool_id)


# reduce_tensor's description of a CUDA storage, after the tensor's own class, shape and dtype
# (bytes travel as hex; the event handle is None when no event sync is needed)
_IPC_FIELDS = (
    "device",
    "handle",
    "storage_size_bytes",
    "storage_offset_bytes",
    "requires_grad",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync_required",
)
