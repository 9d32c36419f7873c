"""``dayzero up``'s back-off after quick exits (stack_child.py) counts on the monotonic clock: on the
wall clock, stepped forward (NTP, a suspended host resumed), a child's exit soon after it was ready
counted as one after a run of a while, and it was started again at once, for ever."""

from __future__ import annotations

import time

from dayzero.stack_child import Child


def test_a_wall_clock_stepped_forward_makes_no_quick_exit_a_run_of_a_while(monkeypatch):
    child = Child("decode0", "decode", started=time.monotonic(), ready_at=time.monotonic())
    child.exited()
    stepped = time.time() + 3600.0
    monkeypatch.setattr(time, "time", lambda: stepped)  # an hour forward, between its start and its exit
    child.started = child.ready_at = time.monotonic()
    child.exited()
    assert (child.quick_exits, child.wait_s) == (2, 1.0) and child.due is not None


def test_a_child_never_seen_ready_exits_quickly_however_long_it_ran():
    """A worker loading for minutes that dies before it is ready (out of memory in its warm-up)."""
    child = Child("decode0", "decode", started=time.monotonic() - 3600.0)
    child.exited()
    child.started = time.monotonic() - 3600.0
    child.exited()
    assert (child.quick_exits, child.wait_s) == (2, 1.0)
