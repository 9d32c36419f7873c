"""A worker's hand backs (room.py) while Redis refuses writes and answers reads (too few replicas:
the push's script is refused, the peers' snapshots are still read): the worker walks its waiting
requests a few times per lease, and each walk's failure was a log line (4 a second at a 1 s lease).
Now the outage's first failure is a line, those after it are counted (outage_log.OutageLog), and the
first hand back that goes through says so with the count. Real Redis; a prefill worker's runtime
in-process."""

from __future__ import annotations

import logging
import re

from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.prefilling import tokens_of
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording
from .prefill_jobs import admitted
from .test_decode_appends import writes_refused

WALKS = 20  # through the refusal (5 s of a worker at a 1 s lease)


def _hand_back_lines(caplog) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.name == "dayzero.serving" and r.levelno >= logging.WARNING]
    return [line for line in said if "hand back" in line]


def _failures_counted(lines: list[str]) -> int:
    """The failures the lines after the first count (``N more hand backs failed``, ``(N more failed``)."""
    return sum(int(n) for line in lines for n in re.findall(r"^(\d+) more|\((\d+) more", line)[0] if n)


def test_hand_backs_failing_while_redis_refuses_writes_are_a_few_lines(demo_dir, redis_url, caplog):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, store = Runtime.load(settings, "prefill30@test", "prefill", False), Lifecycle.connect(redis_url)
    room = Room(runtime, Prefetch(), to_prefill(runtime, recording([], "prefill")))
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())  # (no room here: it goes to the peer)
    empty = {kind: [0, total] for kind, (_, total) in runtime.pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill31@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    loop.intake.submit(admitted(store, "refused-back", tuple(range(2, 302))))
    waiting = loop.intake.drain(0)  # (claimed here)
    try:
        with caplog.at_level(logging.WARNING, "dayzero.serving"):
            with writes_refused(store.r, "min-replicas-to-write"):
                for _ in range(WALKS):
                    assert room.hand_back(waiting, tokens_of, loop.heartbeat) == waiting  # it waits here
            assert room.hand_back(waiting, tokens_of, loop.heartbeat) == []  # writes taken: it goes
    finally:
        loop.stop.set()
    lines = _hand_back_lines(caplog)
    assert lines[0].startswith("hand back failed (") and lines[-1].startswith("hand backs go through again"), lines
    assert len(lines) <= 3 and _failures_counted(lines[1:]) == WALKS - 1, lines  # (a count between: walks over 10 s)
