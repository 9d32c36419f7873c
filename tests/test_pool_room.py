"""What ``up`` refuses before it starts any worker (serving/pool_room.py): the prefill workers' shared pools
past /dev/shm's room, every rank's pools past the host's memory. Each worker found out after loading its
weights, and up restarted it DAYZERO_START_EXITS times before it gave up (24 s for the demo model in a
64 MiB /dev/shm); where one of two prefill workers fit, up went ready and restarted the other for ever."""

from __future__ import annotations

import re
import subprocess

import pytest

from dayzero.config import ModelConfig
from dayzero.host_memory import HostRoom
from dayzero.serving import pool_room
from dayzero.serving.budget import planned_pools
from dayzero.settings import Settings

from .conftest import tiny_config

MIB = 1 << 20
TWO_PREFILL = {"vision": 0, "prefill": 2, "decode": 1}
ONE_EACH = {"vision": 0, "prefill": 1, "decode": 1}


def _refused(settings: Settings, counts: dict[str, int], ranks: dict[str, int] | None = None, **folder) -> str | None:
    pools, budget = planned_pools(settings, ModelConfig.from_dict(tiny_config()), strict=True)
    return pool_room.stack_pools_refused(settings, pools, budget, counts, ranks or {}, **folder)


def test_prefill_workers_whose_segments_do_not_fit_dev_shm_together_are_refused(monkeypatch):
    """docker's 64 MiB /dev/shm, all free, keeps 32 MiB (half of it) for other segments: one pool of
    DAYZERO_KV_BUDGET_MB=20 fits (20 + 32 <= 64), two do not (40 + 32 > 64): the second worker, refused
    at its start, was restarted for ever. The size it names holds both and a full 64 MiB for the rest."""
    monkeypatch.setattr(pool_room, "room", lambda folder: (64 * MIB, 64 * MIB))
    settings = Settings(handoff="shm", kv_budget_mb=20)
    assert _refused(settings, ONE_EACH) is None
    message = _refused(settings, TWO_PREFILL)
    assert "\n" not in message
    assert message.startswith("the attention pools of 2 prefill workers, 2 x ")
    assert "(DAYZERO_KV_BUDGET_MB=20) do not fit in /dev/shm, where 64 MiB of its 64 MiB are free" in message
    assert "lower DAYZERO_KV_BUDGET_MB or --prefill, or give /dev/shm " in message
    size = int(re.search(r"--shm-size=(\d+)m\)$", message).group(1))
    assert 2 * 19 + 64 <= size <= 2 * 20 + 64 + 1  # two segments of 19-20 MiB, 64 MiB left, rounded up
    assert _refused(Settings(handoff="redis", kv_budget_mb=20), TWO_PREFILL) is None  # (no segment)


@pytest.fixture
def small_shm(tmp_path):
    """A 64 MiB tmpfs, as docker's /dev/shm (root only)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_dead_workers_segment_is_swept_before_the_room_is_read(small_shm):
    """A killed worker's 40 MiB segment leaves 24 MiB of the 64: the worker starting next sweeps it
    (shm.sweep_stale) and fits; refusing it up front on the room before the sweep would be wrong."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = small_shm / f"dz-kv-{dead.pid}-0badc0de"
    stale.write_bytes(bytes(40 * MIB))
    assert _refused(Settings(handoff="shm", kv_budget_mb=20), ONE_EACH, folder=small_shm) is None
    assert not stale.exists()
    live = small_shm / "dz-kv-1-0badc0de"  # (init's: alive, kept)
    live.write_bytes(bytes(40 * MIB))
    message = _refused(Settings(handoff="shm", kv_budget_mb=20), ONE_EACH, folder=small_shm)
    assert ", where 24 MiB of its 64 MiB are free (a pool leaves 32 MiB for other segments)" in message
    assert live.exists()


def test_every_ranks_pools_past_the_host_memory_are_refused(monkeypatch):
    """A prefill and a decode worker of 2 ranks each: 4 pools of DAYZERO_KV_BUDGET_MB=4 (3.9-4 MiB each:
    whole blocks) need 15.6-16 MiB before any weights; 15 MiB available is refused, 16 is not."""
    ranks = {"prefill": 2, "decode": 2}
    said = "this host's memory, where 15 MiB are available"
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(15 * MIB, said))
    message = _refused(Settings(handoff="redis", kv_budget_mb=4), ONE_EACH, ranks)
    assert "\n" not in message
    assert re.fullmatch(
        r"the attention pools of 4 prefill and decode ranks, 4 x (3\.9|4\.0) MiB before any weights "
        rf"\(DAYZERO_KV_BUDGET_MB=4\) do not fit in {said}: lower DAYZERO_KV_BUDGET_MB, --prefill-tp or "
        r"--decode-tp, or give it more memory \(docker: --memory\)",
        message,
    )
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(16 * MIB, said))
    assert _refused(Settings(handoff="redis", kv_budget_mb=4), ONE_EACH, ranks) is None


def test_a_refusal_names_only_the_flags_that_can_be_lowered(monkeypatch):
    """Each of up's --prefill, --decode and their -tp is at least 1 (--prefill 0: an argparse error): one
    prefill worker refused by /dev/shm was told to run fewer prefill workers (--prefill), and pools of one
    prefill worker of 2 ranks and a decode worker refused by the host's memory named --prefill and --decode,
    not --prefill-tp."""
    monkeypatch.setattr(pool_room, "room", lambda folder: (64 * MIB, 64 * MIB))
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(MIB, "this host's memory, where 1 MiB are available"))
    shm = _refused(Settings(handoff="shm", kv_budget_mb=40), ONE_EACH)
    assert "MiB for other segments): lower DAYZERO_KV_BUDGET_MB, or give /dev/shm " in shm
    host = _refused(Settings(handoff="redis", kv_budget_mb=4), ONE_EACH, {"prefill": 2, "decode": 1})
    assert host.endswith(
        "1 MiB are available: lower DAYZERO_KV_BUDGET_MB or --prefill-tp, or give it more memory (docker: --memory)"
    )
    single = _refused(Settings(handoff="redis", kv_budget_mb=4), ONE_EACH, {"prefill": 1, "decode": 1})
    assert "lower DAYZERO_KV_BUDGET_MB, or give it more memory" in single


def test_pools_on_cuda_are_not_the_hosts(monkeypatch):
    """(Their device's budget is checked where the worker measures it: rank_loading.)"""
    monkeypatch.setattr(pool_room, "room", lambda folder: (0, 64 * MIB))
    monkeypatch.setattr(pool_room, "host_room", lambda: HostRoom(0, "this host's memory, where 0 MiB are available"))
    assert _refused(Settings(kv_budget_mb=4), TWO_PREFILL) is not None
    assert _refused(Settings(device="cuda", kv_budget_mb=4), TWO_PREFILL) is None
