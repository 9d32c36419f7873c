"""`dayzero up`'s restarts: a child that keeps exiting soon after its start (a worker whose Redis user
lost PING exits 3 at its start check) was started again at once, every 10-17 s for ever, each start a
fresh process importing torch. From its second such exit in a row it waits, twice as long each time;
one quick exit (a kill), or one after a while, is restarted at once. Real processes: an embedded
Redis and a gateway that cannot start (a bad setting)."""

from __future__ import annotations

import time

from dayzero import stack as stack_module
from dayzero.procs import free_port
from dayzero.stack import Stack

NONE = {"vision": 0, "prefill": 0, "decode": 0}
REFUSED = {"DAYZERO_MAX_BATCH": "0"}  # the gateway exits 2 as it starts


def _supervised(stack: Stack, name: str, restarts: int, within_s: float) -> tuple[list[str], list[float]]:
    """Supervise until ``name`` was restarted ``restarts`` times and started again after the last:
    -> (the restart lines, each start's wait: from the pass that saw it exited to its spawn)."""
    child, lines, waits, seen_exit = stack.child(name), [], [], None
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        started = child.started
        restarted = stack.supervise()
        if name in restarted:
            lines.append(child.restart_said())
            seen_exit = time.monotonic()
        if child.started != started and seen_exit is not None:
            waits.append(time.monotonic() - seen_exit)
            seen_exit = None
            if len(waits) == restarts:
                return lines, waits
        time.sleep(0.05)
    raise AssertionError(f"{name}: {lines}")


def test_a_child_exiting_as_it_starts_again_and_again_waits_twice_as_long_each_time(tmp_path):
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    try:
        lines, waits = _supervised(stack, "gateway", 4, 90)
    finally:
        stack.stop()
    waiting = "gateway exited (code 2), {} times in a row within 60 s of its start; starting it again in {} s"
    assert lines == ["gateway exited (code 2); restarted", *(waiting.format(n, 2 ** (n - 2)) for n in (2, 3, 4))]
    assert [round(w) for w in waits] == [0, 1, 2, 4], waits  # (each pass 50 ms apart)


def test_a_child_that_ran_a_while_starts_again_at_once_its_wait_forgotten(tmp_path, monkeypatch):
    """A crash mid-run is restarted as before, in the pass that sees it, and its next quick exits
    count from one."""
    monkeypatch.setattr(stack_module, "RAN_A_WHILE_S", 3.0)
    stack = Stack(NONE, free_port(), tmp_path / "logs", dict(REFUSED))
    stack.start()
    redis = stack.child("redis")
    try:
        for _ in range(2):  # quick exits: the first restarted at once, the second after a wait
            redis.proc.kill()
            lines, waits = _supervised(stack, "redis", 1, 30)
        assert lines == ["redis exited (SIGKILL), 2 times in a row within 3 s of its start; starting it again in 1 s"]
        assert waits[0] >= 1.0
        time.sleep(3.5)
        was = redis.proc
        was.kill()
        was.wait()
        assert "redis" in stack.supervise()
        assert redis.proc is not was and redis.proc.poll() is None, "not started in the pass that saw it exit"
        assert redis.restart_said() == "redis exited (SIGKILL); restarted"
        for _ in range(2):  # quick again: the first wait again, not a doubled one
            redis.proc.kill()
            lines, _ = _supervised(stack, "redis", 1, 30)
        assert lines == ["redis exited (SIGKILL), 2 times in a row within 3 s of its start; starting it again in 1 s"]
    finally:
        stack.stop()
