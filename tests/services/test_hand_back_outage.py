"""A worker's hand backs (room.py) while Redis refuses writes and answers reads (too few replicas:
the push's script is refused, the peers' snapshots are still read): the worker walks its waiting
requests a few times per lease, and each walk's failure was a log line (4 a second at a 1 s lease).
Now the outage's first failure is a line, those after it are counted (outage_log.OutageLog), and the
first hand back that goes through says so with the count. Real Redis; a prefill worker's runtime
in-process."""

from __future__ import annotations

import logging
import re
import time

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


def _walker(demo_dir, redis_url, worker: str, request: str):
    """A prefill worker with no room, one request claimed (-> the waiting tickets), a peer with room
    (``peer_room(bool)`` sets its snapshot; None: it leaves), its room, loop."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, store = Runtime.load(settings, f"{worker}@test", "prefill", False), Lifecycle.connect(redis_url)
    room = Room(runtime, Prefetch(), to_prefill(runtime, recording([], "prefill")))
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())  # (no room here: it goes to the peer)

    def peer_room(free: bool | None) -> None:
        if free is None:
            return Registry(store.r).leave("prefill", f"{worker}@test:peer")
        pools = {kind: [0 if free else total, total] for kind, (_, total) in runtime.pools.usage().items()}
        Registry(store.r).alive("prefill", f"{worker}@test:peer", {"stage": "prefill", "pools": pools, "gauges": {}})

    peer_room(True)
    loop.intake.submit(admitted(store, request, tuple(range(2, 302))))
    return loop.intake.drain(0), peer_room, room, loop, store  # (claimed here)


def test_hand_backs_failing_while_redis_refuses_writes_are_a_few_lines(demo_dir, redis_url, caplog):
    waiting, peer_room, room, loop, store = _walker(demo_dir, redis_url, "prefill30", "refused-back")
    try:
        with caplog.at_level(logging.WARNING, "dayzero.serving"):
            with writes_refused(store.r, "min-replicas-to-write"):
                for _ in range(WALKS):
                    assert room.hand_back(waiting, tokens_of, loop.heartbeat) == waiting  # it waits here
            assert room.hand_back(waiting, tokens_of, loop.heartbeat) == []  # writes taken: it goes
    finally:
        loop.stop.set()
        peer_room(None)
    lines = _hand_back_lines(caplog)
    assert lines[0].startswith("hand back failed (") and lines[-1].startswith("hand backs go through again"), lines
    assert len(lines) <= 3 and _failures_counted(lines[1:]) == WALKS - 1, lines  # (a count between: walks over 10 s)


def test_the_line_after_the_outage_counts_the_failures_not_the_wait_for_a_peers_room(demo_dir, redis_url, caplog):
    """A walk pushes only where a peer has room: the line that hand backs go through again came with
    the next push, however long after the outage, and counted that time as the outage's (3 walks
    refused within milliseconds, then 2 s without a peer's room: "after 2.0 s"; an hour: 3600 s)."""
    waiting, peer_room, room, loop, store = _walker(demo_dir, redis_url, "prefill32", "refused-then-full")
    try:
        with caplog.at_level(logging.WARNING, "dayzero.serving"):
            with writes_refused(store.r, "min-replicas-to-write"):
                for _ in range(3):
                    assert room.hand_back(waiting, tokens_of, loop.heartbeat) == waiting
            peer_room(False)  # writes taken again; no peer has room for a while
            time.sleep(2.0)
            assert room.hand_back(waiting, tokens_of, loop.heartbeat) == waiting
            peer_room(True)
            assert room.hand_back(waiting, tokens_of, loop.heartbeat) == []
    finally:
        loop.stop.set()
        peer_room(None)
    back = _hand_back_lines(caplog)[-1]
    assert back.startswith("hand backs go through again"), back
    assert float(re.findall(r"([\d.]+) s", back)[0]) < 1.0, back  # (was: 2.0 s and more)
