"""What a stack's stop leaves in /dev/shm when a child is slow to stop and is SIGKILLed at the stop
timeout: its process group goes at once, multiprocessing's resource tracker with it (which would have
unlinked the pool segment the worker made). Slow here because its Redis is frozen (SIGSTOP): each
Redis call of a worker's stop waits its client's timeout. Real processes throughout."""

from __future__ import annotations

import signal

from dayzero.procs import free_port
from dayzero.shm import SHM_DIR
from dayzero.stack import Stack

from .conftest import SETTINGS_ENV, wait_until


def made_by(pids: set[int]) -> list[str]:
    """What in /dev/shm names one of these processes (pool segments, parked tensors, ...)."""
    return sorted(p.name for p in SHM_DIR.iterdir() if any(f"-{pid}-" in p.name for pid in pids))


def stopped_with_redis_frozen(stack: Stack, ready: str) -> tuple[list[str], set[int]]:
    """``stack`` started, stopped once the ``ready`` worker says so, its Redis frozen first: the
    names ``stop`` killed, and every child's pid."""
    stack.stop_timeout_s = 1.0  # (10 s for ``dayzero up``: its slowest clean stop is well within)
    stack.start()
    try:
        started = lambda: " ready." in (stack.log_dir / f"{ready}.log").read_text()  # noqa: E731
        assert wait_until(started, 180), stack.log_tail(ready)
        pids = stack.pids()
        assert made_by(pids), "no pool segment"
        stack.redis.send_signal(signal.SIGSTOP)  # (continued by its own SIGTERM, last)
    finally:
        killed = stack.stop()
    return killed, pids


def test_a_worker_killed_at_the_stop_timeout_leaves_no_pool_segment(demo_dir, tmp_path):
    """Seen in a soak: ``up``'s 10 s stop timeout SIGKILLed a prefill worker under load, and its pool
    segment (256 MB by default) stayed in /dev/shm until the next worker start on the host swept it."""
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir)}
    stack = Stack({"vision": 0, "prefill": 1, "decode": 0}, free_port(), tmp_path, env)
    killed, pids = stopped_with_redis_frozen(stack, "prefill0")
    assert "prefill0" in killed  # (else this stop tested nothing)
    assert made_by(pids) == []


def test_every_child_killed_at_the_stop_timeout_leaves_nothing_in_dev_shm(demo_dir, tmp_path):
    """The gateway, a vision, a prefill and a decode worker, each SIGKILLed at its group's timeout."""
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir)}
    stack = Stack({"vision": 1, "prefill": 1, "decode": 1}, free_port(), tmp_path, env)
    killed, pids = stopped_with_redis_frozen(stack, "decode0")
    assert {"gateway", "vision0", "prefill0", "decode0"} <= set(killed)
    assert made_by(pids) == []
