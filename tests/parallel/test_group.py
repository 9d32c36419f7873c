"""Local ranks meeting: the group's timeout bounds the meeting, not the spawned ranks' start (a
loaded host slows spawning and importing past any bound kept short to notice a silent rank), and
a rank that dies while starting fails the group at once; a spawned rank ends when its work returns."""

from __future__ import annotations

import atexit
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.multiprocessing as mp

from dayzero.cgroups import usable_cpus
from dayzero.parallel import group
from dayzero.parallel.group import run_group

TIMEOUT_S = 2.0  # the meeting's bound; a rank's start is made to take twice as long
START_S = 2 * TIMEOUT_S


class _SlowToStart:
    """An argument that takes ``seconds`` to unpickle: in a spawned rank, a start that long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self):
        return (_unpickled_after, (self.seconds,))


def _unpickled_after(seconds: float) -> str:
    time.sleep(seconds)
    return "started"


class _FailsToStart:
    """An argument whose unpickling raises: a spawned rank that dies while starting."""

    def __reduce__(self):
        return (_fail_to_start, ())


def _fail_to_start():
    raise RuntimeError("this rank cannot start")


def _members(group, _arg) -> int:
    return int(group.all_reduce_sum(torch.tensor([1.0])).item())


def test_ranks_slow_to_start_meet_within_a_shorter_timeout():
    """Rank 0 met at once and waited the timeout alone: a rank still starting failed the group."""
    assert run_group(2, _members, _SlowToStart(START_S), timeout=TIMEOUT_S) == 2


def test_a_rank_that_dies_while_starting_fails_the_group_at_once():
    with pytest.raises(mp.ProcessExitedException, match="exit code 1"):
        run_group(2, _members, _FailsToStart(), timeout=30.0)


class _TornDown:
    """Marks, by creating ``path``, that the interpreter tore its modules down (this object, held by
    a module, finalized with them)."""

    def __init__(self, path: str) -> None:  # (os's functions kept: the module may be torn down first)
        self.path, self.open, self.close, self.flags = path, os.open, os.close, os.O_CREAT | os.O_WRONLY

    def __del__(self) -> None:
        self.close(self.open(self.path, self.flags))


_KEPT: list[_TornDown] = []


def _marking_its_exit(group, out: Path) -> int:
    if group.config.rank == 1:
        _KEPT.append(_TornDown(str(out / "torn-down")))
        atexit.register(lambda: (out / "exit-handlers").touch())
    return group.config.rank


def test_a_spawned_rank_runs_its_exit_handlers_and_skips_the_interpreter_teardown(tmp_path):
    """Rank 0 waits for the spawned ranks' exit (their store's host): a worker's stop and every local
    group's end waited for each spawned rank's teardown of torch and the rest too (3-5 s loaded)."""
    assert run_group(2, _marking_its_exit, tmp_path, timeout=30.0) == 0
    assert (tmp_path / "exit-handlers").exists()
    assert not (tmp_path / "torn-down").exists()


class _StartsOnceTold:
    """An argument whose unpickling, in a spawned rank, writes the rank's pid to ``out``/rank1.pid and
    waits for ``out``/go: a rank held in its start, before anything of its own has run."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __reduce__(self):
        return (_started_once_told, (self.out,))


def _started_once_told(out: Path) -> _StartsOnceTold:
    (out / "rank1.pid").write_text(str(os.getpid()))
    while not (out / "go").exists():
        time.sleep(0.05)
    return _StartsOnceTold(out)


def _held(group, told: _StartsOnceTold) -> None:
    """Rank 1 ignores SIGINT and SIGTERM as a worker's followers do (``serve_rank``: torch's own death
    signal for a spawned rank is SIGINT) and says it runs; both ranks wait (for rank 0's SIGKILL)."""
    if group.config.rank == 1:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        (told.out / "running").touch()
    time.sleep(300)


RANK0 = (  # rank 0 of a group of 2 whose rank 1 starts once told, as a process of its own (argv[1]: the folder)
    "import sys; from pathlib import Path; from dayzero.parallel.group import run_group; "
    "from tests.parallel.test_group import _held, _StartsOnceTold; "
    "run_group(2, _held, _StartsOnceTold(Path(sys.argv[1])), timeout=30.0)"
)


@pytest.mark.parametrize("killed", ["while rank 1 starts", "while rank 1 runs"])
def test_a_spawned_rank_exits_once_rank_0_is_sigkilled(tmp_path, killed):
    """Rank 0 SIGKILLed (the OOM killer, up's kill of a frozen worker) left its spawned ranks running: a
    tensor-parallel worker's followers ignore SIGTERM and wait on it (one still starting waited
    ``START_SECONDS`` for its port). ``serve_rank``'s ``die_with(os.getppid())`` came only once the group
    had met, and its check compared the parent with itself: a rank 0 gone before it went unseen."""
    from ..services.conftest import wait_until

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    rank0, rank1 = subprocess.Popen([sys.executable, "-c", RANK0, str(tmp_path)], env=env), None
    try:
        assert wait_until(lambda: (tmp_path / "rank1.pid").exists() or rank0.poll() is not None, 120)
        rank1 = psutil.Process(int((tmp_path / "rank1.pid").read_text()))
        if killed == "while rank 1 runs":
            (tmp_path / "go").touch()
            assert wait_until(lambda: (tmp_path / "running").exists(), 120), "rank 1 did not run"
        rank0.kill()
        rank0.wait()
        (tmp_path / "go").touch()
        gone = lambda: not rank1.is_running() or rank1.status() == psutil.STATUS_ZOMBIE  # noqa: E731
        assert wait_until(gone, 60), f"rank 1 still runs 60 s after rank 0's SIGKILL ({killed})"
    finally:
        rank0.kill()
        rank0.wait()
        if rank1 is not None and rank1.is_running():
            rank1.kill()


def _threads(group) -> int:
    return torch.get_num_threads()


def test_each_local_rank_takes_its_share_of_the_cpus_the_cgroup_quota_allows(tmp_path, monkeypatch):
    """A 4-CPU pod (cpu.max "400000 100000") on a 64-core node, 2 local ranks: 2 threads each, not
    64 // 2 = 32 (os.cpu_count, the node's: 64 threads on 4 CPUs' quota, throttled)."""
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    quota = functools.partial(usable_cpus, tmp_path, tmp_path / "no-self")
    monkeypatch.setattr(group, "usable_cpus", quota)
    assert run_group(2, _threads) == 2  # rank 0's, in this process
