"""What one stage parks for another: bytes in Redis with a TTL (any host), a tensor in a shared-memory
segment (this host's) or in Redis, and which host this is (a shared-memory ref names its host). No KV pool
here: the vision worker parks its images' embeddings with this alone."""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import redis
import torch

from ..shm import PARKED, SHM_DIR, parked_name, sweep
from .keys import key
from .lifecycle import Lifecycle
from .messages import TensorRef


def park(store: Lifecycle, family: str, name: str, data: bytes, ttl_s: float) -> str:
    """Bytes another stage takes once, with GETDEL (``kvstate``: a handed-off state, ``tensor``: image
    embeddings)."""
    location = key(family, name)
    store.r.set(location, data, px=int(ttl_s * 1000))
    return location


def drop_parked(store: Lifecycle, location: str) -> None:
    store.r.delete(location)


@functools.cache
def this_host() -> str:
    """This host's name, read once per process (a system call each handoff and parked tensor was). A host
    renamed while a worker runs: its prefill (vision) worker names states (tensors) by the old name till it
    reads again; a reader that read the old one too takes them, one started after the rename refuses them
    as another host's (re-runs, ``elsewhere``) till that worker restarts."""
    return socket.gethostname()


def is_this_host(host: str) -> bool:
    """Whether a state or tensor published on ``host`` lives here: the name read once, read again
    where they differ (this host renamed since, and ``host`` its new name)."""
    if host == this_host():
        return True
    this_host.cache_clear()
    return host == this_host()


def elsewhere(what: str, host: str, publisher: str) -> LookupError:
    return LookupError(
        f"{what} lives on host {host}, not this one ({this_host()}): use handoff=redis across hosts "
        f"(this host renamed since its {publisher} worker started: restart that {publisher} worker)"
    )


def publish_tensor(
    tensor: torch.Tensor, key: str, transport: str, store: Lifecycle, ttl_s: float, attempt: int = 0
) -> TensorRef:
    """Park an fp32 tensor for another process for ``ttl_s``: a new shared-memory segment whose
    name carries its deadline, ``key`` and ``attempt`` (``unlink_parked_before``), or a Redis key
    with that TTL (a re-run's overwrites it)."""
    data = tensor.detach().float().cpu().contiguous()
    if transport == "redis":
        location = park(store, "tensor", key, data.numpy().tobytes(), ttl_s)
    else:
        segment = shared_memory.SharedMemory(
            name=parked_name(ttl_s, key, attempt), create=True, size=max(1, data.numel() * 4)
        )
        torch.frombuffer(segment.buf, dtype=torch.float32, count=data.numel()).copy_(data.flatten())
        location = segment.name
        resource_tracker.unregister(segment._name, "shared_memory")  # noqa: SLF001 - the reader unlinks it
        segment.close()
    return TensorRef(transport=transport, location=location, host=this_host(), shape=tuple(data.shape))


def take_tensor(ref: TensorRef, store: Lifecycle) -> torch.Tensor:
    """Read a parked tensor once and free its storage."""
    count = math.prod(ref.shape)
    if ref.transport == "redis":
        data = store.r.getdel(ref.location)
        if data is None:
            raise LookupError(f"parked tensor {ref.location} expired")
        return torch.frombuffer(bytearray(data), dtype=torch.float32, count=count).view(ref.shape).clone()
    if not is_this_host(ref.host):
        raise elsewhere("shared-memory tensor", ref.host, "vision")
    try:
        segment = shared_memory.SharedMemory(name=ref.location)
    except FileNotFoundError:  # expired and swept, or its host's vision worker died
        raise LookupError(f"parked tensor {ref.location} is gone") from None
    try:
        return torch.frombuffer(segment.buf, dtype=torch.float32, count=count).view(ref.shape).clone()
    finally:
        segment.close()
        segment.unlink()


def discard_tensor(ref: TensorRef, store: Lifecycle) -> None:
    """Free a parked tensor nobody will read (its request ended before prefill)."""
    if ref.transport == "redis":
        drop_parked(store, ref.location)
    elif is_this_host(ref.host):
        (SHM_DIR / ref.location).unlink(missing_ok=True)


def sweep_parked(folder: Path = SHM_DIR) -> list[str]:
    """Unlink parked tensors past their deadline: their reader died, or the request was lost."""
    now_ms = time.time() * 1000
    return sweep(PARKED, lambda deadline_ms: deadline_ms < now_ms, folder)


def drop_embeddings(ref: TensorRef | None, store: Lifecycle) -> None:
    """A delivery no run will take (an older run's, or its request ended): free its parked image
    embeddings, which only it refers to (a re-run encodes them again), not left till their deadline."""
    if ref is not None:
        with contextlib.suppress(redis.RedisError):  # (parked in Redis: they expire)
            discard_tensor(ref, store)
