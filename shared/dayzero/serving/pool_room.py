"""Whether attention pools fit the memory they are made in, refused in one line naming the settings:
/dev/shm for a prefill worker's shared pools (DAYZERO_HANDOFF=shm; a pool leaves ``kv.shared.headroom``
of it free), the host's memory for pools on CPU (``host_memory.host_room``: nothing kept beyond it).

A worker checks its own before allocating them (``rank_loading``); ``up`` checks the whole stack's
before it starts any worker (``stack_pools_refused``): each worker refused found out after loading its
weights, and was restarted DAYZERO_START_EXITS times before up gave up."""

from __future__ import annotations

from pathlib import Path

from ..host_memory import HostRoom, host_room
from ..kv.pools import KVPools
from ..kv.shared import SHM_HEADROOM, headroom, segment_bytes, shm_fits
from ..settings import Settings
from ..shm import SHM_DIR, room, sweep_stale
from .budget import MIB, Budget, torch_dtype


def shm_refusal(pools: str, size: int, budget: Budget, free: int, total: int, more: str = "") -> str:
    """``pools`` (e.g. "the attention pools' 256.0 MiB") of ``budget``, segments of ``size`` bytes in all, do
    not fit in /dev/shm; the room they need: what other segments hold, theirs, and the most a pool leaves."""
    needed = -(-(total - free + size + SHM_HEADROOM) // MIB)
    return (
        f"{pools} ({budget.chosen_by}) do not fit in {SHM_DIR}, where {free / MIB:.0f} MiB of its {total / MIB:.0f} "
        f"MiB are free (a pool leaves {headroom(total) // MIB} MiB for other segments): lower DAYZERO_KV_BUDGET_MB"
        f"{more}, or give {SHM_DIR} {needed} MiB (docker: --shm-size={needed}m)"
    )


def memory_refusal(pools: str, budget: Budget, room: HostRoom, more: str = "") -> str:
    """``pools`` of ``budget`` do not fit in the host's (or its container's) memory."""
    return (
        f"{pools} ({budget.chosen_by}) do not fit in {room.said}: lower DAYZERO_KV_BUDGET_MB{more}, or give it more "
        "memory (docker: --memory)"
    )


def host_pools_refused(pools: KVPools, budget: Budget) -> str | None:
    """Why a worker's pools on CPU, about to be zeroed, cannot be: more than the host has left (past free
    memory, short of its total, their allocation passed and the OOM killer ended the worker as it zeroed
    them: SIGKILL, no line said why)."""
    planned, left = pools.storage_bytes(), host_room()
    if left is None or planned <= left.bytes:
        return None
    return memory_refusal(f"the attention pools' {planned / MIB:.1f} MiB", budget, left)


def stack_pools_refused(
    settings: Settings,
    pools: KVPools,
    budget: Budget,
    counts: dict[str, int],
    ranks: dict[str, int],
    folder: Path = SHM_DIR,
) -> str | None:
    """Why ``up``'s workers on CPU cannot all make their pools (each rank of each prefill and decode worker
    makes ``pools``), before any weights are loaded: the prefill workers' shared segments past /dev/shm's
    room (stale segments swept first, as each worker sweeps them), or every rank's pools past the host's
    memory (a floor: the weights come on top). ``folder``: /dev/shm. None on CUDA (pools on the device:
    its budget is checked)."""
    if settings.device != "cpu":
        return None
    segments = counts["prefill"] if settings.handoff == "shm" else 0
    if segments:
        size = segment_bytes(pools.layout, pools.blocks, torch_dtype(settings))
        sweep_stale(folder)
        free, total = room(folder)
        if not shm_fits(segments * size, free, total):
            what = f"the attention pools of {_prefill_workers(segments)}, {segments} x {size / MIB:.1f} MiB"
            return shm_refusal(what, segments * size, budget, free, total, _fewer({"--prefill": segments}))
    every = sum(counts[stage] * ranks.get(stage, 1) for stage in ("prefill", "decode"))
    each, left = pools.storage_bytes(), host_room()
    if left is None or every * each <= left.bytes:
        return None
    what = f"the attention pools of {every} prefill and decode ranks, {every} x {each / MIB:.1f} MiB before any weights"
    flags = {
        f"--{stage}{tp}": n
        for stage in ("prefill", "decode")
        for tp, n in (("", counts[stage]), ("-tp", ranks.get(stage, 1)))
    }
    return memory_refusal(what, budget, left, _fewer(flags))


def _prefill_workers(n: int) -> str:
    return f"{n} prefill workers" if n > 1 else "1 prefill worker"


def _fewer(flags: dict[str, int]) -> str:
    """What follows "lower DAYZERO_KV_BUDGET_MB" in a refusal: those of up's ``flags`` (flag: its value) that
    can be lowered (each is at least 1: --prefill 0 is refused), e.g. ", --prefill-tp or --decode-tp"."""
    lowered = [flag for flag, n in flags.items() if n > 1]
    return "".join(f", {flag}" for flag in lowered[:-1]) + (f" or {lowered[-1]}" if lowered else "")
