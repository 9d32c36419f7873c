"""The attention-state pools a worker's settings give it, sized before anything is loaded (``up``
refuses what its workers could not start with, in one line naming the variables).

The budget: DAYZERO_KV_BUDGET_MB where set; else, on CUDA, DAYZERO_KV_MEMORY_FRACTION of the device's
whole memory less what this worker holds once its weights are loaded (``device_budget``, as vLLM's
gpu_memory_utilization); else (CPU, or a plan made before any weights are loaded) the least that holds
the windows and one sequence of the context limit, or 256 MiB if more."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..config import ModelConfig, context_limit
from ..kv.layout import PoolLayout
from ..kv.pools import KVPools
from ..settings import Settings

log = logging.getLogger("dayzero.worker")

LEAST_HOST_BUDGET = 256 << 20  # the CPU default's floor: room for more than one sequence of a small model
MIB = 1 << 20


def torch_dtype(settings: Settings) -> torch.dtype:
    """DAYZERO_DTYPE as torch's: the weights' compute and the pools' dtype."""
    return torch.bfloat16 if settings.dtype == "bfloat16" else torch.float32


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """A CUDA worker's device once its weights are loaded: nothing another process holds or frees counts."""

    total_bytes: int  # the device's whole memory (torch.cuda.mem_get_info's total)
    own_bytes: int  # what this process's allocator holds: its weights and buffers (torch.cuda.memory_reserved)


@dataclass(frozen=True, slots=True)
class Budget:
    bytes: int
    chosen_by: str  # how, for the worker's log and inspect: "DAYZERO_KV_BUDGET_MB=256", ...


def device_budget(total_bytes: int, own_bytes: int, fraction: float) -> int:
    """Attention-state bytes of a worker whose weights and attention state together take ``fraction``
    of a device of ``total_bytes`` and which holds ``own_bytes`` once loaded (the rest of the device:
    activations, the expert cache, other workers' shares). Free memory is not read: two workers loading
    on one GPU each saw it before the other allocated, and each took 0.8 of it."""
    return max(int(total_bytes * fraction) - own_bytes, 0)


def _budget(settings: Settings, layout: PoolLayout, sequences: int, limit: int, memory: DeviceMemory | None) -> Budget:
    """The budget of the module docstring's rule. ValueError naming the numbers where the device's
    share cannot hold ``sequences`` windows and one sequence of ``limit`` tokens."""
    if settings.kv_budget_mb is not None:
        return Budget(settings.kv_budget_mb * MIB, f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb}")
    least = KVPools.least_budget(layout, limit, sequences, torch_dtype(settings))
    held = f"{sequences} sequences' windows and one sequence of {limit} tokens"
    if memory is None and settings.device != "cpu":  # a plan (up, inspect): the least the worker will take
        return Budget(least, f"at least the {least / MIB:.1f} MiB that hold {held}, on CUDA")
    if memory is None:
        if least >= LEAST_HOST_BUDGET:
            return Budget(least, f"the least that holds {held}")
        return Budget(LEAST_HOST_BUDGET, f"256 MiB, more than the {least / MIB:.1f} MiB that hold {held}")
    fraction = settings.kv_memory_fraction
    share = device_budget(memory.total_bytes, memory.own_bytes, fraction)
    of = (
        f"DAYZERO_KV_MEMORY_FRACTION={fraction} of the device's {memory.total_bytes / MIB:.0f} MiB less the "
        f"{memory.own_bytes / MIB:.0f} MiB this worker holds (its weights)"
    )
    if share < least:
        raise ValueError(
            f"{of} is {share / MIB:.1f} MiB of attention state, under the {least / MIB:.1f} MiB that hold {held} "
            "(DAYZERO_MAX_BATCH, DAYZERO_MAX_CONTEXT): raise the fraction (up splits it between the workers it "
            "places on one GPU), set DAYZERO_KV_BUDGET_MB, or lower the batch or the context"
        )
    return Budget(share, of)


def budget_pools(settings: Settings, cfg: ModelConfig, memory: DeviceMemory | None = None) -> tuple[KVPools, Budget]:
    """The pools of the budget on the meta device, as a worker sizes them (``inspect`` and ``up``
    plan them too, without ``memory``): windows for ``DAYZERO_MAX_BATCH`` sequences (one more, the
    padding rows, under DAYZERO_DECODE_GRAPHS), the rest of the budget to the growing pools.
    ValueError naming the variables when the budget cannot hold those windows."""
    layout = PoolLayout.of(cfg, settings.block_size, settings.dtype, mtp=settings.speculative_tokens > 0)
    sequences = settings.max_batch + settings.decode_graphs  # decode graphs' padding rows: a sequence of their own
    budget = _budget(settings, layout, sequences, context_limit(cfg, settings.max_context), memory)
    try:
        pools = KVPools.from_budget(layout, budget.bytes, sequences, torch_dtype(settings), device="meta")
    except ValueError:
        raise ValueError(
            f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb} cannot hold the sliding windows of "
            f"DAYZERO_MAX_BATCH={settings.max_batch} sequences in blocks of DAYZERO_BLOCK_SIZE={settings.block_size} "
            "rows: raise the budget, or lower the batch or the block size"
        ) from None
    return pools, budget


def planned_pools(
    settings: Settings, cfg: ModelConfig, strict: bool = False, memory: DeviceMemory | None = None
) -> tuple[KVPools, Budget]:
    """``budget_pools``, checked against the context limit: pools shorter than one sequence of it
    (its requests would fail after admission; only an explicit DAYZERO_KV_BUDGET_MB can be) are a
    ValueError when ``strict`` (``up``), else a warning (a worker started by hand)."""
    pools, budget = budget_pools(settings, cfg, memory)
    limit = context_limit(cfg, settings.max_context)
    if pools.capacity_tokens() < limit:
        short = (
            f"DAYZERO_KV_BUDGET_MB={settings.kv_budget_mb} holds {pools.capacity_tokens()} tokens of one sequence, "
            f"under the context limit of {limit} (DAYZERO_MAX_CONTEXT, at most the model's "
            f"{cfg.max_position_embeddings}): such a request would fail once admitted; raise DAYZERO_KV_BUDGET_MB "
            "or lower DAYZERO_MAX_CONTEXT"
        )
        if strict:
            raise ValueError(short)
        log.warning("%s", short)
    return pools, budget
