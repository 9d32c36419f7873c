"""Loading a worker's rank: its share of the model (progress reported every few percent, to the log
and to ``/ready``) and its attention pools, of the kind its handoff needs."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import redis
import torch

from ..checkpoint import load_model
from ..kv.pools import KVPools
from ..kv.shared import CudaSharedPools, NoShmRoom, Segment, SharedPools
from ..model.plan import AttentionOptions
from ..parallel.collectives import Group
from ..settings import Settings
from ..shm import sweep_stale
from ..speculative_checks import speculation_refused
from .budget import MIB, Budget, DeviceMemory, device_budget, planned_pools, torch_dtype
from .liveness import process_id
from .pool_room import host_pools_refused, shm_refusal
from .ranks import KEEPALIVE_S, Ranks
from .registry import Registry

log = logging.getLogger("dayzero.worker")
CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"  # (torch's RuntimeError, from malloc's ENOMEM)


class LoadProgress:
    """Weight loading, reported every few percent to the log and to Redis (``/ready`` shows it)."""

    def __init__(self, registry: Registry, worker: str, stage: str, step: int = 5) -> None:
        self.registry, self.worker, self.stage, self.step = registry, worker, stage, step
        self.shown, self.started, self.started_at = -step, time.monotonic(), time.time()

    def __call__(self, done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent >= self.shown + self.step:
            self.shown = percent
            log.info("%s loading weights: %d%% (%d/%d tensors)", self.worker, percent, done, total)
            self._report(percent)

    def done(self) -> None:
        log.info("%s loaded its weights in %.1f s", self.worker, time.monotonic() - self.started)
        self._report(None)

    def _report(self, percent: int | None) -> None:
        with contextlib.suppress(redis.RedisError):  # Redis not up yet: the log still has it
            self.registry.loading(self.worker, self.stage, percent, process_id(), self.started_at)


def load_ranks(
    settings: Settings, group: Group, shared: bool, on_progress: Callable[[int, int], None] | None = None
) -> tuple[Ranks, Segment | None]:
    """This rank's share of the model and its pools (``shared``: another process can read them)."""
    dtype = torch_dtype(settings)
    device = torch.device(group.device)
    measured = device.type == "cuda" and settings.kv_budget_mb is None  # (the budget: a share of the device)
    model = load_model(
        settings.checkpoint_dir(),
        dtype,
        group.device,
        progress=False,
        expert_cache_bytes=settings.expert_cache_mb << 20,
        on_progress=on_progress,
        group=group,
    )
    if refused := speculation_refused(model.cfg, len(model.mtp), settings.speculative_tokens):
        raise ValueError(refused)
    memory = _agreed(_device_memory(device), group, settings) if measured else None
    sized, budget = planned_pools(settings, model.cfg, memory=memory)
    log.info(
        "attention-state budget %.1f MiB (%s), %d tokens of one sequence",
        budget.bytes / MIB,
        budget.chosen_by,
        sized.capacity_tokens(),
    )
    if shared and settings.handoff == "shm" and (swept := sweep_stale()):  # (their pages: memory host_room counts)
        log.warning("unlinked %d pool segment(s) left by dead workers: %s", len(swept), swept)
    if device.type == "cpu" and (refused := host_pools_refused(sized, budget)):  # (shm's pages are memory too)
        raise ValueError(refused)
    try:
        pools, segment = _allocated(settings, sized, dtype, group.device, shared)
    except (RuntimeError, MemoryError) as exc:
        if not _out_of_memory(exc):
            raise
        raise ValueError(_no_room(sized, budget, device, exc)) from None
    keepalive = min(KEEPALIVE_S, settings.group_timeout_s / 4)
    options = AttentionOptions.of(settings)
    ranks = Ranks(group, model, pools, options, keepalive_s=keepalive, decode_graphs=settings.decode_graphs)
    return ranks, segment


def _allocated(
    settings: Settings, sized: KVPools, dtype: torch.dtype, device: str, shared: bool
) -> tuple[KVPools, Segment | None]:
    """The pools ``sized`` plans (on the meta device), allocated of the kind the handoff reads."""
    layout = sized.layout
    if shared and settings.handoff == "shm":  # (dead workers' segments swept: load_ranks)
        return SharedPools.create(layout, sized.blocks, dtype)
    if shared and settings.handoff == "cuda_ipc":
        return CudaSharedPools.create(layout, sized.blocks, dtype, device), None
    return KVPools(layout, sized.blocks, dtype, device), None


def _out_of_memory(exc: BaseException) -> bool:
    """Whether allocating the pools failed for want of memory: CUDA's, the host's (torch's CPU allocator
    raises a RuntimeError of several lines), or /dev/shm's room (``NoShmRoom``)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or CPU_ALLOCATION_FAILED in str(exc)


def _no_room(sized: KVPools, budget: Budget, device: torch.device, exc: BaseException) -> str:
    """Why the pools were not allocated, in one line: another process holds the memory the budget
    counted on (free memory is not read to size them: ``_device_memory``), or the budget is too large."""
    planned = sum(t.nbytes for t in sized.tensors())
    if isinstance(exc, NoShmRoom):
        return shm_refusal(f"the attention pools' {planned / MIB:.1f} MiB", exc.size, budget, exc.free, exc.total)
    free, fraction = "", ""  # (the fraction is read on CUDA alone: budget.py)
    if device.type == "cuda":  # (read now, for the message alone)
        free_bytes, total_bytes = torch.cuda.mem_get_info(device)
        free = f", where {free_bytes / MIB:.0f} MiB of its {total_bytes / MIB:.0f} MiB are free"
        fraction = " or, unset, DAYZERO_KV_MEMORY_FRACTION"
    return (
        f"the attention pools' {planned / MIB:.1f} MiB ({budget.chosen_by}) do not fit on {device}{free}: another "
        f"process may hold its memory: free it, or lower DAYZERO_KV_BUDGET_MB{fraction}"
    )


def _device_memory(device: torch.device) -> DeviceMemory:
    """The device's whole memory and this process's own (never what is free: a worker loading beside
    it on the same GPU, as ``up`` places them, would count as this one's weights)."""
    torch.cuda.empty_cache()  # (what loading freed is given back, not held by torch's allocator)
    return DeviceMemory(torch.cuda.mem_get_info(device)[1], torch.cuda.memory_reserved(device))


def _agreed(memory: DeviceMemory, group: Group, settings: Settings) -> DeviceMemory:
    """The measurement of the rank with the least budget: a group's ranks carve the same pools."""
    every = group.all_gather(torch.tensor([[memory.total_bytes, memory.own_bytes]], device=group.device), dim=0)
    least = min(every.tolist(), key=lambda m: device_budget(*m, settings.kv_memory_fraction))
    return DeviceMemory(*least)
