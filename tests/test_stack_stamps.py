"""``stack_stamps.stale``: up's judgement of which workers are frozen, by one read of their stamps. A
judgement only: it wrote ``Child.stamped`` (the last stamp read, which a restarted Redis loses), so the
same question asked twice could be answered from what the first asking had written."""

from __future__ import annotations

import copy
import os
import socket
import types

from dayzero.serving.liveness import Seen, process_id
from dayzero.stack_child import Child
from dayzero.stack_stamps import StampRead, stale

BOUND_S = 30.0  # DAYZERO_FROZEN_WORKER_S


def _running(name: str, started: float, ready_at: float | None) -> Child:
    """A running prefill worker (its process this one: only its pid and ``poll`` are read)."""
    proc = types.SimpleNamespace(pid=os.getpid(), poll=lambda: None)
    return Child(name, "prefill", proc=proc, started=started, ready_at=ready_at)


def test_stale_asked_twice_gives_one_answer_and_changes_no_child():
    """A ready worker whose stamp is 40 s old by Redis's clock (read at monotonic 1000 s, Redis's time
    5000 s, the stamp at 4960 s: 960 s monotonic), spawned at 900 s, and a starting one spawned at 990 s
    (the stamp is from before its spawn: another process's under its pid): the first is frozen, the
    second not, and both stay as they were."""
    process = process_id(os.getpid(), socket.gethostname())
    read = StampRead({"prefill": Seen(5000.0, {process: 4960.0}, {process: 4950.0})}, 999.9, 1000.0, False)
    hung, starting = _running("prefill0", 900.0, 950.0), _running("prefill1", 990.0, None)
    before = [copy.copy(hung), copy.copy(starting)]
    answers = [stale(read, [hung, starting], BOUND_S, 0.0) for _ in range(2)]
    assert answers == [[hung], [hung]]
    assert [hung, starting] == before, "stale() wrote to a Child"
