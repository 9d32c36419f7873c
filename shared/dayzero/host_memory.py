"""What new memory the host (or the container this process runs in) can take now without the OOM killer:
/proc/meminfo's MemAvailable (free pages, and the page cache the kernel would reclaim) plus free swap,
no more than what a cgroup's memory limit leaves (docker's --memory). No torch here: ``up`` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # a container's own cgroup (its namespace's root): v2 files, or v1's memory/
KIB = 1 << 10
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class HostRoom:
    bytes: int
    said: str  # where the number comes from, for a refusal: "this host's memory, where ... MiB are available"


def host_room(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> HostRoom | None:
    """The room of the module docstring (None without /proc/meminfo: not Linux). The cgroup's is its
    limit less its usage, its page cache counted back (reclaimable, as MemAvailable counts it)."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        available, swap = (int(fields[key].split()[0]) * KIB for key in ("MemAvailable", "SwapFree"))
    except (OSError, KeyError, ValueError):
        return None
    room = HostRoom(available + swap, f"this host's memory, where {(available + swap) / MIB:.0f} MiB are available")
    limited = _cgroup_room(cgroup)
    if limited is not None and limited[0] + swap < room.bytes:
        left, limit = limited
        said = (
            f"this container's memory, where {(left + swap) / MIB:.0f} MiB of its {limit / MIB:.0f} MiB limit are free"
        )
        room = HostRoom(left + swap, said)
    return room


def _cgroup_room(cgroup: Path) -> tuple[int, int] | None:
    """(bytes the limit leaves, the limit) of cgroup v2 (memory.max) or v1 (memory/memory.limit_in_bytes);
    None where no limit is set (v2's "max", v1's 2^63 less a page) or none is readable."""
    for folder, limit_file, usage_file in (
        (cgroup, "memory.max", "memory.current"),
        (cgroup / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        try:
            limit_text = (folder / limit_file).read_text().strip()
            if limit_text == "max" or int(limit_text) >= 1 << 62:
                return None
            usage, limit = int((folder / usage_file).read_text()), int(limit_text)
            stats = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        except (OSError, ValueError):
            continue
        cache = int(stats.get("active_file", 0)) + int(stats.get("inactive_file", 0))
        return max(limit - usage + cache, 0), limit
    return None
