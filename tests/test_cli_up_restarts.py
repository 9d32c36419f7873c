"""`dayzero up`'s restarts: a child that keeps exiting soon after its start (a worker whose Redis user
lost PING exits 3 at its start check) was started again at once, every 10-17 s for ever, each start a
fresh process importing torch. From its second such exit in a row it waits, twice as long each time;
one quick exit (a kill), or one after a while, is restarted at once. Real processes: an embedded
Redis and a gateway that cannot start (a bad setting)."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

import httpx
import pytest
import redis

import dayzero.stack
from dayzero import stack_child
from dayzero.procs import free_port
from dayzero.stack import Child, Stack, StartFailed

NONE = {"vision": 0, "prefill": 0, "decode": 0}
REFUSED = {"DAYZERO_MAX_BATCH": "0"}  # the gateway exits 2 as it starts
FIRST_WAIT_S = 0.25  # stack_child.FIRST_WAIT_S here (1 s): the waits these tests see out


def _supervised(stack: Stack, name: str, restarts: int, within_s: float) -> tuple[list[str], list[float]]:
    """Supervise until ``name`` was restarted ``restarts`` times and started again after the last:
    -> (the restart lines, each start's wait: from when the pass that saw it exited noted the exit to
    its spawn, both on the child's own clock: a loaded host's slow passes lengthen no wait measured)."""
    child, lines, waits, seen_exit = stack.child(name), [], [], None
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        started, before = child.started, time.monotonic()
        restarted = stack.supervise()
        if name in restarted:
            lines.append(child.restart_said())
            seen_exit = before if child.due is None else child.due - child.wait_s  # (when ``exited`` ran)
        if child.started != started and seen_exit is not None:
            waits.append(child.started - seen_exit)
            seen_exit = None
            if len(waits) == restarts:
                return lines, waits
        time.sleep(0.05)
    raise AssertionError(f"{name}: {lines}")


def test_a_child_exiting_as_it_starts_again_and_again_waits_twice_as_long_each_time(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_child, "FIRST_WAIT_S", FIRST_WAIT_S)
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    try:
        lines, waits = _supervised(stack, "gateway", 4, 90)
    finally:
        stack.stop()
    waiting = "gateway exited (code 2), {} times in a row before it had run 60 s ready; starting it again in {:g} s"
    doubled = {n: FIRST_WAIT_S * 2 ** (n - 2) for n in (2, 3, 4)}  # its nth exit in a row: 0.25, 0.5, 1 s
    assert lines == ["gateway exited (code 2); restarted", *(waiting.format(n, w) for n, w in doubled.items())]
    # started at once, then not before each wait the lines name (a CI run at load ~10 measured from the pass's
    # end, at a first wait of 1 s: 1.75, 2.75, 5.0 s, rounded 2, 3, 5)
    assert waits[0] < 1.0 and all(w >= least for w, least in zip(waits[1:], doubled.values(), strict=True)), waits


def test_a_child_that_ran_a_while_starts_again_at_once_its_wait_forgotten(tmp_path, monkeypatch):
    """A crash mid-run is restarted as before, in the pass that sees it, and its next quick exits
    count from one."""
    monkeypatch.setattr(stack_child, "RAN_A_WHILE_S", 1.5)
    monkeypatch.setattr(stack_child, "FIRST_WAIT_S", FIRST_WAIT_S)
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    redis = stack.child("redis")
    try:
        for _ in range(2):  # quick exits: the first restarted at once, the second after a wait
            redis.proc.kill()
            lines, waits = _supervised(stack, "redis", 1, 30)
        assert lines == [
            "redis exited (SIGKILL), 2 times in a row before it had run 1.5 s ready; starting it again in 0.25 s"
        ]
        assert waits[0] >= FIRST_WAIT_S
        time.sleep(2.0)
        was = redis.proc
        was.kill()
        was.wait()
        assert "redis" in stack.supervise()
        assert redis.proc is not was and redis.proc.poll() is None, "not started in the pass that saw it exit"
        assert redis.restart_said() == "redis exited (SIGKILL); restarted"
        for _ in range(2):  # quick again: the first wait again, not a doubled one
            redis.proc.kill()
            lines, _ = _supervised(stack, "redis", 1, 30)
        assert lines == [
            "redis exited (SIGKILL), 2 times in a row before it had run 1.5 s ready; starting it again in 0.25 s"
        ]
    finally:
        stack.stop()


def test_a_child_whose_start_takes_longer_than_a_while_and_exits_soon_after_it_is_ready_waits(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """A gateway whose start takes longer than ``RAN_A_WHILE_S``, killed soon after it answers, twice (a
    worker whose weights load for minutes and that exits at its warm-up: an ACL refusing a script load,
    out of memory). Counted from its spawn, each run was a while and it was started again at once, for
    ever; counted from when it was ready, the second such exit waits."""
    monkeypatch.setattr(stack_child, "RAN_A_WHILE_S", 2.0)
    monkeypatch.setattr(stack_child, "FIRST_WAIT_S", FIRST_WAIT_S)
    stack = Stack(NONE, free_port(), tmp_path / "logs", {"DAYZERO_CHECKPOINT": str(tiny_checkpoint)})
    stack.start()
    gateway = stack.child("gateway")
    try:
        for _ in range(2):
            stack.until_ready("gateway", 120)
            time.sleep(max(0.0, gateway.started + 2.2 - time.monotonic()))  # its start: longer than a while
            assert time.monotonic() - gateway.ready_at < 2.0, "the gateway was ready as it was spawned"
            gateway.proc.kill()
            gateway.proc.wait()
            lines, waits = _supervised(stack, "gateway", 1, 30)
    finally:
        stack.stop()
    assert lines == [
        "gateway exited (SIGKILL), 2 times in a row before it had run 2 s ready; starting it again in 0.25 s"
    ]
    assert waits[0] >= FIRST_WAIT_S


def test_until_ready_starts_a_child_waiting_after_its_quick_exits_and_says_why_one_cannot_run(tmp_path, monkeypatch):
    """One ``supervise()`` only notes a second quick exit (the child starts once its wait is over): the
    tests that killed Redis twice within a minute of its start each looped on ``supervise()`` their own
    way, and one went on with no Redis. ``until_ready`` supervises until the child runs ready again, and
    a child that cannot (a gateway refused at its start) is a StartFailed naming why."""
    monkeypatch.setattr(stack_child, "FIRST_WAIT_S", FIRST_WAIT_S)
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    redis_child = stack.child("redis")
    try:
        for _ in range(2):
            redis_child.proc.kill()
            redis_child.proc.wait()
            assert "redis" in stack.supervise()
        assert redis_child.proc.poll() is not None, "not a second quick exit: started at once"
        stack.until_ready("redis", 30)
        assert redis_child.proc.poll() is None and redis.Redis(port=stack.redis_port).ping()
        with pytest.raises(StartFailed) as failed:
            stack.until_ready("gateway", 3)
    finally:
        stack.stop()
    said = r"gateway did not run ready within 3 s \(gateway exited \(code 2\)[;,] .*\); the end of its log:\n"
    assert re.match(said, str(failed.value)), failed.value
    assert "DAYZERO_MAX_BATCH" in str(failed.value)


def test_up_s_loop_sees_a_child_ready_for_a_few_seconds_so_its_exit_after_a_while_restarts_it_at_once(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """A child's run counts from when up saw it ready: a loop whose passes came seldom never saw one ready
    for less than their period, and its exits, each after a while ready, counted as quick (the second
    waited). A gateway ready (answering /health) for a few seconds past ``RAN_A_WHILE_S``, then killed,
    twice, under up's own loop (``supervised_until``): each restarted at once."""
    monkeypatch.setattr(stack_child, "RAN_A_WHILE_S", 1.0)
    stack = Stack(NONE, free_port(), tmp_path / "logs", {"DAYZERO_CHECKPOINT": str(tiny_checkpoint)})
    gateway, lines, killed = None, [], []

    def kill_each_after_a_while_ready() -> None:
        for _ in range(2):
            proc = gateway.proc
            while not _answers(f"{stack.url}/health") or proc.poll() is not None:  # (its own probe, not up's)
                time.sleep(0.05)
                proc = gateway.proc
            time.sleep(stack_child.RAN_A_WHILE_S + 2.0)  # (up's pass may see it ready up to a pass later)
            proc.kill()
            killed.append(proc)
            while gateway.proc is proc:
                time.sleep(0.05)

    stack.start()
    gateway = stack.child("gateway")
    killer = threading.Thread(target=kill_each_after_a_while_ready, daemon=True)
    killer.start()
    try:
        said = lambda name: lines.append(stack.child(name).restart_said())
        assert stack.supervised_until(lambda: len(lines) == 2, 180, said), lines
        killer.join(10)
    finally:
        stack.stop()
    assert len(killed) == 2 and lines == ["gateway exited (SIGKILL); restarted"] * 2


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_child_restarted_by_a_supervising_thread_outlives_that_thread(tmp_path):
    """Every child asks for SIGKILL when the *thread* that forked it ends (procs.die_with,
    PR_SET_PDEATHSIG): a child restarted by a ``supervise()`` in a thread that then returned died with it
    (bench/recovery.py's restarted workers, -9). The stack forks every child on a thread of its own."""
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    redis_child = stack.child("redis")
    try:
        redis_child.proc.kill()
        redis_child.proc.wait()
        supervisor = threading.Thread(target=stack.supervise)
        supervisor.start()
        supervisor.join()
        time.sleep(0.5)  # (the death signal is sent as the thread ends)
        assert redis_child.proc.poll() is None, f"redis restarted by the thread ended {redis_child.proc.returncode}"
        assert redis.Redis(port=stack.redis_port).ping()
    finally:
        stack.stop()


def test_a_worker_restarted_by_a_supervising_thread_outlives_that_thread(tmp_path, monkeypatch):
    """As Redis above, through ``procs.spawn``: the gateway's and the workers' way (the test above passed
    with their spawn called on the supervising thread). The worker is a ``sleep`` here (``stack.spawn``
    patched: still called on the stack's spawner)."""
    spawn = dayzero.stack.spawn
    monkeypatch.setattr(dayzero.stack, "spawn", lambda cmd, log, env: spawn(["sleep", "300"], log))
    exited = subprocess.Popen(["true"])
    exited.wait()
    child = Child("prefill0", "prefill", proc=exited)
    stack = Stack({}, 0, tmp_path, children=[child])
    try:
        supervisor = threading.Thread(target=stack.supervise)
        supervisor.start()
        supervisor.join()
        time.sleep(0.5)  # (the death signal is sent as the thread ends)
        assert child.proc is not exited, "prefill0 was not restarted"
        assert child.proc.poll() is None, f"prefill0 restarted by the thread ended {child.proc.returncode}"
    finally:
        stack.stop()


def test_a_pass_from_another_thread_while_the_stack_stops_restarts_nothing(tmp_path, monkeypatch):
    """``stop`` SIGTERMs the workers and waits for them; a ``supervise()`` from another thread meanwhile
    (bench/recovery.py's supervising thread) found the one that had ended and started it again: a worker
    started by the stop. Here decode0 ignores SIGTERM (``stop`` waits ``stop_timeout_s`` on it) while
    prefill0 ends at once; the workers restarted are ``sleep``s (``stack.spawn`` patched)."""
    spawn, restarted = dayzero.stack.spawn, []

    def restart(cmd: list[str], log, env) -> subprocess.Popen:
        restarted.append(spawn(["sleep", "300"], log))
        return restarted[-1]

    monkeypatch.setattr(dayzero.stack, "spawn", restart)
    quick = Child("prefill0", "prefill", proc=spawn(["sleep", "300"], tmp_path / "prefill0.log"))
    ignoring = spawn(["sh", "-c", "trap '' TERM; echo ignoring; sleep 300"], tmp_path / "decode0.log")
    slow = Child("decode0", "decode", proc=ignoring)
    deadline = time.monotonic() + 30
    while "ignoring" not in (tmp_path / "decode0.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)  # (a SIGTERM before its trap ended it at once: no stop waited on it)
    stack = Stack({}, 0, tmp_path, children=[quick, slow], stop_timeout_s=1.0)
    stopping = threading.Thread(target=stack.stop)
    stopping.start()
    try:
        passes = []
        while stopping.is_alive():
            passes += stack.supervise()
            time.sleep(0.05)
        assert quick.proc.poll() is not None and slow.proc.poll() == -signal.SIGKILL, "no stop waited on decode0"
        assert passes == [] and restarted == [], f"restarted while the stack stopped: {passes}"
    finally:
        stopping.join()
        for proc in restarted:
            proc.kill()
            proc.wait()
