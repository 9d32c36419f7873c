"""What new memory the host, or its container, can take now (host_memory.py), read from files laid out as
/proc/meminfo and a cgroup's (v2, v1) are; the numbers are the files', summed by hand."""

from __future__ import annotations

from pathlib import Path

from dayzero.host_memory import host_room

MIB = 1 << 20
NO_SELF = Path("/nonexistent/self/cgroup")  # no /proc/self/cgroup: the mount's roots are read
MEMINFO = "MemTotal:       24683772 kB\nMemFree:         1000000 kB\nMemAvailable:    2097152 kB\nSwapFree: {swap} kB\n"


def _meminfo(folder: Path, swap_kib: int = 0) -> Path:
    path = folder / "meminfo"
    path.write_text(MEMINFO.format(swap=swap_kib))
    return path


def _cgroup(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_the_host_room_is_memavailable_with_free_swap(tmp_path):
    """2097152 KiB available (2048 MiB) and 524288 KiB of free swap (512 MiB): zeroing into swap is no OOM kill."""
    room = host_room(_meminfo(tmp_path, swap_kib=524288), tmp_path / "no-cgroup", NO_SELF)
    assert room.bytes == (2048 + 512) * MIB
    assert room.said == "this host's memory, where 2560 MiB are available"


def test_a_cgroup_v2_limit_under_the_host_room_is_what_counts(tmp_path):
    """memory.max 1024 MiB, 900 MiB of it used, 100 + 50 MiB of that page cache (reclaimable): 124 + 150 MiB left."""
    cgroup = _cgroup(
        tmp_path / "cg",
        {
            "memory.max": f"{1024 * MIB}\n",
            "memory.current": f"{900 * MIB}\n",
            "memory.stat": f"anon 1\nactive_file {100 * MIB}\ninactive_file {50 * MIB}\n",
        },
    )
    room = host_room(_meminfo(tmp_path), cgroup, NO_SELF)
    assert room.bytes == 274 * MIB
    assert room.said == "this container's memory, where 274 MiB of its 1024 MiB limit are free"


def test_a_cgroup_v1_limit_counts_and_an_unlimited_one_does_not(tmp_path):
    """v1's files under memory/; its "no limit" is 2^63 less a page (this machine's own cgroup)."""
    v1 = {
        "memory/memory.limit_in_bytes": f"{512 * MIB}\n",
        "memory/memory.usage_in_bytes": f"{500 * MIB}\n",
        "memory/memory.stat": "cache 0\nactive_file 0\ninactive_file 0\n",
    }
    assert host_room(_meminfo(tmp_path), _cgroup(tmp_path / "v1", v1), NO_SELF).bytes == 12 * MIB
    unlimited = {**v1, "memory/memory.limit_in_bytes": "9223372036854771712\n"}
    assert host_room(_meminfo(tmp_path), _cgroup(tmp_path / "v1max", unlimited), NO_SELF).bytes == 2048 * MIB
    v2_max = {"memory.max": "max\n", "memory.current": "1\n", "memory.stat": "active_file 0\n"}
    assert host_room(_meminfo(tmp_path), _cgroup(tmp_path / "v2max", v2_max), NO_SELF).bytes == 2048 * MIB


def test_free_swap_counts_up_to_what_the_cgroup_may_still_swap(tmp_path):
    """The host's 8192 MiB of free swap were added to a cgroup's room whatever its own swap limit: v2's
    memory.max 1024 MiB (1000 used) and memory.swap.max 0 (a pod's) said "8216 MiB of its 1024 MiB limit are
    free", and pools of 4 GiB were let in to be OOM-killed at 1 GiB. Docker's --memory 1g (swap.max 1024 MiB,
    100 swapped): 24 + 924 MiB; v1's memsw (memory and swap: 768 MiB limit, 600 used, over memory's 512 and 500):
    12 + (256 - 100) MiB; no memory limit but no swap: MemAvailable alone."""
    v2 = {"memory.max": f"{1024 * MIB}\n", "memory.current": f"{1000 * MIB}\n", "memory.stat": "active_file 0\n"}
    no_swap = _cgroup(tmp_path / "pod", {**v2, "memory.swap.max": "0\n", "memory.swap.current": "0\n"})
    meminfo = _meminfo(tmp_path, swap_kib=8192 * 1024)
    assert (
        host_room(meminfo, no_swap, NO_SELF).said
        == "this container's memory, where 24 MiB of its 1024 MiB limit are free"
    )
    swap = {"memory.swap.max": f"{1024 * MIB}\n", "memory.swap.current": f"{100 * MIB}\n"}
    assert host_room(meminfo, _cgroup(tmp_path / "docker", {**v2, **swap}), NO_SELF).bytes == (24 + 924) * MIB
    v1 = {
        **_limits("memory", limit=512, usage=500),
        "memory/memory.memsw.limit_in_bytes": f"{768 * MIB}\n",
        "memory/memory.memsw.usage_in_bytes": f"{600 * MIB}\n",
    }
    assert host_room(meminfo, _cgroup(tmp_path / "v1", v1), NO_SELF).bytes == (12 + 156) * MIB
    unlimited = {"memory.max": "max\n", "memory.current": "1\n", "memory.swap.max": "0\n", "memory.swap.current": "0\n"}
    assert host_room(meminfo, _cgroup(tmp_path / "nolimit", unlimited), NO_SELF).bytes == 2048 * MIB


def test_a_cgroup_limit_above_the_host_room_changes_nothing(tmp_path):
    cgroup = _cgroup(
        tmp_path / "cg", {"memory.max": f"{8192 * MIB}\n", "memory.current": "0\n", "memory.stat": "active_file 0\n"}
    )
    assert host_room(_meminfo(tmp_path), cgroup, NO_SELF).said == "this host's memory, where 2048 MiB are available"


def test_the_tightest_limit_of_this_process_cgroup_and_those_above_it_counts(tmp_path):
    """/proc/self/cgroup names v1's memory cgroup /outer/inner: inner's limit leaves 300 MiB, outer's (over
    both) 100 MiB; the root's is unset. A path the mount lacks (docker's /docker/<id>: the container's own
    cgroup is the mount's root) falls back to the root."""
    cgroup = _cgroup(
        tmp_path / "cg",
        {
            **_limits("memory/outer", limit=1024, usage=924),
            **_limits("memory/outer/inner", limit=512, usage=212),
        },
    )
    own = tmp_path / "self-cgroup"
    own.write_text("5:cpu,cpuacct:/elsewhere\n4:memory:/outer/inner\n0::/\n")
    assert host_room(_meminfo(tmp_path), cgroup, own).bytes == 100 * MIB
    own.write_text("4:memory:/docker/0123abcd\n")
    cgroup = _cgroup(tmp_path / "docker", _limits("memory", limit=700, usage=100))
    assert host_room(_meminfo(tmp_path), cgroup, own).bytes == 600 * MIB


def test_a_v1_cgroup_above_this_process_counts_back_the_page_cache_its_children_hold(tmp_path):
    """v1's usage is hierarchical, its memory.stat's active_file the folder's own pages alone (total_active_file:
    its children's too). /outer (1200 MiB limit, 1199 used) holds no page of its own; /outer/inner (no limit), this
    process's, holds 982 MiB of page cache: 1 + 982 MiB are free. Read from active_file, 1 MiB was, and pools of
    600 MiB were refused there (measured: in such a cgroup they were made and zeroed, nothing killed)."""
    total = f"total_active_file {700 * MIB}\ntotal_inactive_file {282 * MIB}\n"
    cgroup = _cgroup(
        tmp_path / "cg",
        {
            **_limits("memory/outer", limit=1200, usage=1199, stat="active_file 0\ninactive_file 0\n" + total),
            **_limits("memory/outer/inner", limit=1 << 43, usage=1190, stat=total.replace("total_", "") + total),
        },
    )
    own = tmp_path / "self-cgroup"
    own.write_text("4:memory:/outer/inner\n")
    room = host_room(_meminfo(tmp_path), cgroup, own)
    assert room.said == "this container's memory, where 983 MiB of its 1200 MiB limit are free"


def _limits(folder: str, limit: int, usage: int, stat: str = "active_file 0\ninactive_file 0\n") -> dict[str, str]:
    """v1's files of a cgroup ``folder`` with ``limit`` and ``usage`` MiB, no page cache unless ``stat`` says."""
    return {
        f"{folder}/memory.limit_in_bytes": f"{limit * MIB}\n",
        f"{folder}/memory.usage_in_bytes": f"{usage * MIB}\n",
        f"{folder}/memory.stat": stat,
    }


def test_no_meminfo_is_no_room_known(tmp_path):
    assert host_room(tmp_path / "absent", tmp_path, NO_SELF) is None
