"""This process's cgroups, read from /proc/self/cgroup and the cgroup mount: the folders of a controller's
cgroup and of each above it (``cgroup_folders``: host_memory walks them for the memory limit), and the CPUs
their quotas let it use (``usable_cpus``: docker's --cpus, Kubernetes' CPU limits, which its affinity
does not show)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")  # v2's files, or v1's under <controller>/
OWN_CGROUP = Path("/proc/self/cgroup")


def cgroup_folders(controller: str, cgroup: Path = CGROUP, own: Path = OWN_CGROUP) -> list[tuple[Path, int]]:
    """(folder, cgroup version 2 or 1) of this process's cgroups, its own and each above it to the mount's root:
    v2's ("0::/path") and v1's ``controller``'s (under ``cgroup``/``controller``). A path not under the mount (a
    container's own cgroup mounted as the root) is its root; without /proc/self/cgroup, the roots."""
    try:
        lines = [line.split(":", 2) for line in own.read_text().splitlines()]
    except OSError:
        lines = []
    owned = [(cgroup, 2, path) for _, controllers, path in lines if not controllers]
    owned += [(cgroup / controller, 1, path) for _, names, path in lines if controller in names.split(",")]
    folders = []
    for root, cgroup_version, path in owned or [(cgroup, 2, "/"), (cgroup / controller, 1, "/")]:
        folder = root / path.strip("/")
        while folder != root and not folder.is_dir():
            folder = folder.parent
        folders += [(f, cgroup_version) for f in (folder, *folder.parents) if f.is_relative_to(root)]
    return folders


def usable_cpus(cgroup: Path = CGROUP, own: Path = OWN_CGROUP) -> int:
    """The CPUs this process may run on (its affinity), no more than the tightest CPU quota of its cgroups
    allows: ceil(quota / period), at least 1 (a 2-CPU pod on a 64-core node: 2, not 64)."""
    quotas = [
        cpus
        for folder, cgroup_version in cgroup_folders("cpu", cgroup, own)
        if (cpus := _quota(folder, cgroup_version))
    ]
    return min([len(os.sched_getaffinity(0)), *quotas])


def _quota(folder: Path, cgroup_version: int) -> int | None:
    """The CPUs ``folder``'s quota allows: v2's cpu.max ("quota period"), v1's cpu.cfs_quota_us over
    cpu.cfs_period_us; None where none is set (v2's "max", v1's -1) or it is not readable."""
    try:
        if cgroup_version == 2:
            quota, period = (folder / "cpu.max").read_text().split()
        else:
            quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        if quota in ("max", "-1"):
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None
