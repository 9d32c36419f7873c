"""``Stack.wait_ready`` with a worker held back after quick exits (stack_child.py) while another
worker of its stage serves: /ready answers 200 throughout. It returned once that worker was started
again, still loading (``up`` said "ready" with it down; a bench went on with one prefill worker
fewer). It returns once the worker is seen ready. Real processes: Redis, a gateway, the workers."""

from __future__ import annotations

import time

from dayzero.stack import Child

from .conftest import start_stack


def test_wait_ready_waits_for_a_worker_started_after_its_wait_to_be_ready(text_dir, tmp_path):
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1})
    try:
        # as a worker is after its second exit in a row before it had run a while ready: its start 1 s on
        held = Child("prefill1", "prefill", restarts=2, why="exited (code 3)", quick_exits=2, wait_s=1.0)
        held.due = time.monotonic() + 1.0
        stack.children.append(held)
        stack.wait_ready(timeout_s=120)
        assert held.proc is not None and held.proc.poll() is None
        assert held.ready_at is not None, "wait_ready returned with prefill1 started, not ready yet"
    finally:
        stack.stop()
