"""Local ranks meeting: the group's timeout bounds the meeting, not the spawned ranks' start (a
loaded host slows spawning and importing past any bound kept short to notice a silent rank), and
a rank that dies while starting fails the group at once; a spawned rank ends when its work returns."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

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
