"""The CPUs this process may use (cgroups.py): its affinity, no more than its cgroups' CPU quotas allow, read
from files laid out as /proc/self/cgroup and a cgroup mount's (v2's cpu.max, v1's cpu.cfs_*_us) are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dayzero.cgroups import usable_cpus

NODE_CPUS = 64  # the node's, all in this process's affinity (a pod's CPU limit does not narrow it)
NO_SELF = Path("/nonexistent/self/cgroup")  # no /proc/self/cgroup: the mount's roots are read


@pytest.fixture(autouse=True)
def _node_affinity(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(NODE_CPUS)))


def _cgroup(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def _own(folder: Path, text: str) -> Path:
    (folder / "self-cgroup").write_text(text)
    return folder / "self-cgroup"


def test_a_v2_quota_of_the_cgroup_above_this_process_caps_the_cpus(tmp_path):
    """A pod's limit of 1.5 CPUs (cpu.max "150000 100000") on /kubepods/pod, its container /kubepods/pod/c
    unlimited ("max 100000"): 2 CPUs (rounded up), not the node's 64."""
    cgroup = _cgroup(
        tmp_path / "cg", {"kubepods/pod/cpu.max": "150000 100000\n", "kubepods/pod/c/cpu.max": "max 100000\n"}
    )
    assert usable_cpus(cgroup, _own(tmp_path, "0::/kubepods/pod/c\n")) == 2


def test_the_tightest_quota_counts_and_one_under_a_cpu_is_one(tmp_path):
    """docker --cpus 0.5 inside a cgroup of 8: 1 (at least one thread); its own cgroup mounted as the
    root (a path the mount lacks: the root is read)."""
    cgroup = _cgroup(tmp_path / "cg", {"cpu.max": "50000 100000\n", "outer/cpu.max": "800000 100000\n"})
    assert usable_cpus(cgroup, _own(tmp_path, "0::/outer\n")) == 1
    assert usable_cpus(cgroup, _own(tmp_path, "0::/docker/0123abcd\n")) == 1


def test_a_v1_quota_counts_and_minus_one_is_none(tmp_path):
    """v1's cpu controller (listed as "cpu,cpuacct"): cfs_quota_us 400000 over cfs_period_us 100000 is 4 CPUs;
    the root's -1 (no quota) counts for nothing."""
    cgroup = _cgroup(
        tmp_path / "cg",
        {
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
            "cpu/pod/cpu.cfs_quota_us": "400000\n",
            "cpu/pod/cpu.cfs_period_us": "100000\n",
        },
    )
    assert usable_cpus(cgroup, _own(tmp_path, "4:memory:/pod\n3:cpu,cpuacct:/pod\n0::/\n")) == 4
    assert usable_cpus(cgroup, _own(tmp_path, "3:cpu,cpuacct:/\n")) == NODE_CPUS


def test_no_quota_max_or_missing_files_leave_the_affinity(tmp_path):
    """v2's "max", no cgroup files at all, no /proc/self/cgroup, an unreadable cpu.max: the affinity's 64."""
    assert usable_cpus(_cgroup(tmp_path / "max", {"cpu.max": "max 100000\n"}), NO_SELF) == NODE_CPUS
    assert usable_cpus(tmp_path / "absent", NO_SELF) == NODE_CPUS
    assert usable_cpus(_cgroup(tmp_path / "bad", {"cpu.max": "garbage\n"}), NO_SELF) == NODE_CPUS


def test_a_quota_above_the_affinity_changes_nothing(tmp_path, monkeypatch):
    """taskset to 3 CPUs in a cgroup of 8: 3."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert usable_cpus(_cgroup(tmp_path / "cg", {"cpu.max": "800000 100000\n"}), NO_SELF) == 3
