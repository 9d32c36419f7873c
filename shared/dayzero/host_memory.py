"""What new memory the host (or the container this process runs in) can take now without the OOM killer:
/proc/meminfo's MemAvailable (free pages, and the page cache the kernel would reclaim) plus free swap,
no more than what a cgroup's memory limit leaves (docker's --memory). No torch here: ``up`` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cgroups import CGROUP, OWN_CGROUP, cgroup_folders

MEMINFO = Path("/proc/meminfo")
# (limit, usage, swap limit, swap usage): v2's swap files count swap alone, v1's memsw memory and swap together
V2 = ("memory.max", "memory.current", "memory.swap.max", "memory.swap.current")
V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.memsw.limit_in_bytes", "memory.memsw.usage_in_bytes")
KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class HostRoom:
    bytes: int
    said: str  # where the number comes from, for a refusal: "this host's memory, where ... MiB are available"


def host_room(meminfo: Path = MEMINFO, cgroup: Path = CGROUP, own: Path = OWN_CGROUP) -> HostRoom | None:
    """The room of the module docstring (None without /proc/meminfo: not Linux). A cgroup's is its limit less
    its usage, its page cache counted back (reclaimable, as MemAvailable counts it): the tightest of this
    process's cgroup (``own``: /proc/self/cgroup) and those above it. Free swap counts up to what each of them
    lets it still swap (docker's --memory-swap, v2's memory.swap.max: 0 in many a pod)."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        available, swap = (int(fields[key].split()[0]) * KIB for key in ("MemAvailable", "SwapFree"))
    except (OSError, KeyError, ValueError):
        return None
    folders = [(folder, V2 if version == 2 else V1) for folder, version in cgroup_folders("memory", cgroup, own)]
    swap = min([swap, *(left for folder, files in folders if (left := _swap_room(folder, *files)) is not None)])
    room = HostRoom(available + swap, f"this host's memory, where {(available + swap) / MIB:.0f} MiB are available")
    limits = [limit for folder, files in folders if (limit := _limit_room(folder, *files[:2]))]
    if limits and min(limits)[0] + swap < room.bytes:
        left, limit = min(limits)
        said = (
            f"this container's memory, where {(left + swap) / MIB:.0f} MiB of its {limit / MIB:.0f} MiB limit are free"
        )
        room = HostRoom(left + swap, said)
    return room


def _limit_room(folder: Path, limit_file: str, usage_file: str) -> tuple[int, int] | None:
    """(bytes ``folder``'s limit leaves, the limit); None where none is set or it is not readable."""
    try:
        limit, usage = _bytes(folder / limit_file), _bytes(folder / usage_file)
        stats = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if limit is None or usage is None:
        return None
    # (v1's active_file counts the folder's own pages alone, its total_active_file those below it too, as its
    # usage does: a cgroup above this process's holds its page cache in its children's)
    cache = sum(int(stats.get(f"total_{lru}", stats.get(lru, 0))) for lru in ("active_file", "inactive_file"))
    return max(limit - usage + cache, 0), limit


def _swap_room(folder: Path, limit_file: str, usage_file: str, swap_limit_file: str, swap_file: str) -> int | None:
    """The swap ``folder``'s cgroup may still take: its swap limit less its swap in use (v1's memsw files count
    memory and swap together: its memory's taken out); None where none is set or it is not readable."""
    try:
        swap_limit, swapped = _bytes(folder / swap_limit_file), _bytes(folder / swap_file)
        if swap_limit is not None and swap_limit_file.startswith("memory.memsw."):  # (v1)
            swap_limit, swapped = swap_limit - _bytes(folder / limit_file), swapped - _bytes(folder / usage_file)
    except (OSError, ValueError, TypeError):
        return None
    return None if swap_limit is None or swapped is None else max(swap_limit - swapped, 0)


def _bytes(path: Path) -> int | None:
    """A cgroup file's number of bytes; None for no limit (v2's "max", v1's 2^63 less a page)."""
    text = path.read_text().strip()
    return None if text == "max" or int(text) >= 1 << 62 else int(text)
