"""What a worker refuses to start with about its attention pools: memory its device does not have
(serving/rank_loading.py), a share of the device no worker can take (settings.py, device_shares.py)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from multiprocessing import shared_memory

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.device_shares import kv_fractions
from dayzero.host_memory import HostRoom
from dayzero.kv import pools
from dayzero.kv import shared as kv_shared
from dayzero.kv.layout import POOL_KINDS, PoolLayout
from dayzero.parallel.collectives import Group
from dayzero.serving import pool_room
from dayzero.serving.rank_loading import load_ranks
from dayzero.serving.worker import refused_by_dayzero
from dayzero.settings import Settings
from dayzero.shm import SHM_DIR

from .conftest import tiny_config

ONE_EACH = {"vision": 0, "prefill": 1, "decode": 1}


def _cuda_out_of_memory():
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 MiB.")


def _host_out_of_memory():
    """torch's own CPU allocator failure: malloc of 2^60 bytes fails at once (no address space holds it)."""
    return torch.empty(1 << 60, dtype=torch.uint8)


@pytest.mark.parametrize("fail", [_cuda_out_of_memory, _host_out_of_memory])
def test_pools_the_device_cannot_hold_are_a_one_line_refusal_naming_the_budget(fail, tiny_checkpoint, monkeypatch):
    """Another process holding the GPU's memory (free memory is not read when sizing), or a
    DAYZERO_KV_BUDGET_MB past the host's (plain pools: generate, a decode worker): the pools' allocation
    failed, and the worker died on torch's traceback naming no setting (on CPU a RuntimeError)."""

    planned_on = pools.zeros_on  # (the plan's pools, on the meta device, hold no memory)

    def out_of_memory(device):
        return planned_on(device) if torch.device(device).type == "meta" else lambda shape, dtype: fail()

    monkeypatch.setattr(pools, "zeros_on", out_of_memory)
    with pytest.raises(ValueError) as refused:
        load_ranks(Settings(checkpoint=tiny_checkpoint, kv_budget_mb=4), Group(), shared=False)
    message = str(refused.value)
    assert "\n" not in message and refused.value.__cause__ is None and refused.value.__suppress_context__
    assert "(DAYZERO_KV_BUDGET_MB=4) do not fit on cpu" in message
    assert "lower DAYZERO_KV_BUDGET_MB" in message
    assert "DAYZERO_KV_MEMORY_FRACTION" not in message  # (read on CUDA alone: on cpu, advice that changes nothing)
    planned = float(re.search(r"pools' ([0-9.]+) MiB", message).group(1))
    assert 3.9 <= planned <= 4.0  # the 4 MiB budget, less what whole blocks leave over


def test_pools_on_cpu_past_the_hosts_available_memory_are_refused_before_they_are_zeroed(tiny_checkpoint, monkeypatch):
    """A budget between the host's free memory and its total: the allocation passed (overcommit), and the
    kernel's OOM killer ended the worker as it zeroed the pools (SIGKILL, -9: no line said why; ``up``
    restarted it). Pools of DAYZERO_KV_BUDGET_MB=4 (3.9-4 MiB: whole blocks) where 3 MiB are available
    are refused; where 4 MiB are, they are made (nothing kept beyond MemAvailable: it counts the kernel's
    reserve out already)."""

    def zeroed(device):
        return pytest.fail("the pools were zeroed") if torch.device(device).type == "cpu" else planned_on(device)

    planned_on, said = pools.zeros_on, "this host's memory, where 3 MiB are available"
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(3 << 20, said))
    monkeypatch.setattr(pools, "zeros_on", zeroed)
    with pytest.raises(ValueError) as refused:
        load_ranks(Settings(checkpoint=tiny_checkpoint, kv_budget_mb=4), Group(), shared=False)
    assert refused_by_dayzero(refused.value)  # (the worker's start says it in one line)
    assert re.fullmatch(
        rf"the attention pools' (3\.9|4\.0) MiB \(DAYZERO_KV_BUDGET_MB=4\) do not fit in {said}: lower "
        r"DAYZERO_KV_BUDGET_MB, or give it more memory \(docker: --memory\)",
        str(refused.value),
    )
    monkeypatch.setattr(pools, "zeros_on", planned_on)
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(4 << 20, said))
    ranks, _ = load_ranks(Settings(checkpoint=tiny_checkpoint, kv_budget_mb=4), Group(), shared=False)
    assert ranks.pools.storage_bytes() <= 4 << 20


def test_a_dead_workers_segment_is_swept_before_the_hosts_memory_is_read(tiny_checkpoint, monkeypatch):
    """A killed prefill worker's segment holds its pages (tmpfs: no reclaim frees them) until the next start
    sweeps it; the memory check read the room before that sweep and refused pools that fit once it was done
    (a 1500 MiB cgroup, a dead worker's 600 MiB segment: 900 MiB pools refused, "595 MiB ... free"). Here
    3 MiB are available while the dead worker's segment is there, 5 MiB once it is swept: 4 MiB pools fit."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = SHM_DIR / f"{kv_shared.PREFIX}-{dead.pid}-0badc0de"
    stale.write_bytes(bytes(1 << 20))
    room = {True: HostRoom(3 << 20, "3 MiB"), False: HostRoom(5 << 20, "5 MiB")}
    monkeypatch.setattr(pool_room, "host_room", lambda: room[stale.exists()])
    try:
        _, segment = load_ranks(Settings(checkpoint=tiny_checkpoint, handoff="shm", kv_budget_mb=4), Group(), True)
    finally:
        stale.unlink(missing_ok=True)
    segment.close()
    segment.unlink()
    assert 3 << 20 < segment.size <= 4 << 20


def test_a_shared_pool_larger_than_dev_shm_is_refused_before_its_segment_is_made(tiny_checkpoint, monkeypatch):
    """A prefill worker's pools (DAYZERO_HANDOFF=shm) past what /dev/shm holds (docker's default: 64 MiB,
    here 60 of them free, under the default 256 MiB budget): the segment was made (a sparse file) and zeroed
    until the tmpfs ran out of pages: the worker died of a SIGBUS (exit 135, the demo model in a 64 MiB tmpfs),
    the host's other segments failing meanwhile."""

    def made(*args, **kwargs):
        pytest.fail("the segment was made: it would fill /dev/shm")

    monkeypatch.setattr(shared_memory, "SharedMemory", made)
    monkeypatch.setattr(kv_shared, "room", lambda: (60 << 20, 64 << 20))  # (free, size) of a container's
    with pytest.raises(ValueError) as refused:
        load_ranks(Settings(checkpoint=tiny_checkpoint, handoff="shm"), Group(), shared=True)
    message = str(refused.value)
    assert "\n" not in message and refused.value.__cause__ is None and refused.value.__suppress_context__
    assert ") do not fit in /dev/shm, where 60 MiB of its 64 MiB are free" in message
    planned = float(re.search(r"pools' ([0-9.]+) MiB \(256 MiB, more than", message).group(1))
    assert 255 <= planned <= 256  # the default budget, less what whole blocks leave over
    room = int(
        re.search(r"lower DAYZERO_KV_BUDGET_MB, or give /dev/shm (\d+) MiB \(docker: --shm-size=\1m\)$", message)[1]
    )
    assert 4 + 255 + 64 <= room <= 4 + 256 + 64 + 1  # what others hold, the segment, 64 MiB left, rounded up


def test_a_budget_that_fits_a_small_dev_shm_is_not_refused(tiny_checkpoint, monkeypatch):
    """docker's default /dev/shm (64 MiB, here 60 of them free): the 64 MiB kept for other segments took all
    of it, and DAYZERO_KV_BUDGET_MB=4 was refused (base 654a55c made the 4 MiB segment; 'lower
    DAYZERO_KV_BUDGET_MB' could never help). A smaller /dev/shm keeps half of it."""
    monkeypatch.setattr(kv_shared, "room", lambda: (60 << 20, 64 << 20))  # (free, size) of a container's
    _, segment = load_ranks(Settings(checkpoint=tiny_checkpoint, handoff="shm", kv_budget_mb=4), Group(), shared=True)
    try:
        assert 3 << 20 < segment.size <= 4 << 20
    finally:
        segment.close()
        segment.unlink()


def test_a_segment_whose_room_went_while_it_was_made_is_refused_and_unlinked(tiny_checkpoint, monkeypatch):
    """Two prefill workers (up --prefill 2) each read the room of a 200 MiB /dev/shm before either made its
    120 MiB segment: both passed the check, both zeroed theirs, both died of a SIGBUS (exit -7, a 200 MiB
    tmpfs in a mount namespace). The pages are taken at once (fallocate: ENOSPC, not a SIGBUS, where
    they are gone since): here another segment took them after the check."""
    rooms = iter([(1 << 40, 1 << 40), (40 << 20, 200 << 20)])  # (free, size): at the check, then after the other's

    def taken_meanwhile(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kv_shared, "room", lambda: next(rooms))
    monkeypatch.setattr(os, "posix_fallocate", taken_meanwhile)
    with pytest.raises(ValueError) as refused:
        load_ranks(Settings(checkpoint=tiny_checkpoint, handoff="shm"), Group(), shared=True)
    assert ") do not fit in /dev/shm, where 40 MiB of its 200 MiB are free" in str(refused.value)
    assert refused_by_dayzero(refused.value)  # (the worker's start says it in one line)
    assert not list(SHM_DIR.glob(f"{kv_shared.PREFIX}-{os.getpid()}-*"))  # (unlinked: no 256 MiB left behind)


def test_a_segment_on_a_filesystem_without_fallocate_is_still_made(monkeypatch):
    """posix_fallocate refused for want of support (musl calls the syscall alone: EOPNOTSUPP) is no refusal:
    the segment's zeroing takes its pages, as before."""

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    layout = PoolLayout.of(ModelConfig.from_dict(tiny_config()), 3, "float32")
    made, segment = kv_shared.SharedPools.create(layout, {kind: 2 for kind in POOL_KINDS}, torch.float32)
    try:
        assert segment.size == kv_shared.segment_bytes(layout, made.blocks, torch.float32)
    finally:
        segment.close()
        segment.unlink()


@pytest.mark.parametrize("fraction", [1.0, 0.96])
def test_a_fraction_that_fills_the_gpu_is_refused(fraction):
    """The fraction is of what torch's allocator holds; each process's CUDA context, the libraries'
    workspaces and the activations lie outside it: all of the device was accepted and cannot run."""
    with pytest.raises(ValueError, match="DAYZERO_KV_MEMORY_FRACTION|kv_memory_fraction"):
        Settings(device="cuda", kv_memory_fraction=fraction)
    assert Settings(device="cuda", kv_memory_fraction=0.95).kv_memory_fraction == 0.95


def test_workers_sharing_a_gpu_may_not_fill_it_together():
    """Two workers on one GPU at 0.5 each took all of it (accepted: 2 x 0.5 was not over 1)."""
    with pytest.raises(ValueError, match=r"up places 2 prefill and decode workers on cuda:0: set it to 0.47 or less"):
        kv_fractions(Settings(device="cuda", kv_memory_fraction=0.5), ONE_EACH, {})
    assert kv_fractions(Settings(device="cuda", kv_memory_fraction=0.47), ONE_EACH, {}) == {}
