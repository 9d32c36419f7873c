"""``Stack.wait_ready`` with a worker waiting out its wait after quick exits (stack_child.py): /ready
answered 200 for the other worker of its stage, and ``wait_ready`` returned with the stack one worker
short (the callers that killed a worker and then waited for /ready went on without it). Real
processes: Redis, a gateway, a prefill and two decode workers."""

from __future__ import annotations

import os
import signal

import httpx

from dayzero import stack_child

from .conftest import start_stack

WAIT_S = 6.0  # the wait after the second quick exit here (1 s by default: a pass of wait_ready may be longer)


def test_wait_ready_waits_for_a_worker_waiting_to_start_again_while_ready_answers_200(text_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(stack_child, "FIRST_WAIT_S", WAIT_S)
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 2})
    decode1 = stack.child("decode1")
    try:
        for _ in range(2):  # the first quick exit starts it again at once, the second waits
            os.killpg(decode1.proc.pid, signal.SIGKILL)
            decode1.proc.wait(30)
            assert stack.supervise() == ["decode1"]
        assert decode1.due is not None and decode1.wait_s == WAIT_S
        assert httpx.get(f"{stack.url}/ready", timeout=10).status_code == 200  # decode0 serves the stage
        reasons = []
        stack.wait_ready(timeout_s=60, on_wait=lambda body: reasons.append(body["reason"]), every_s=0)
        assert decode1.due is None and decode1.proc.poll() is None, "wait_ready returned while decode1 waited"
        assert reasons and reasons[0].startswith("decode1 exited (SIGKILL), 2 times in a row"), reasons
    finally:
        stack.stop()
