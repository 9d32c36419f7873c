"""Room across workers on one clock, Redis's: a peer whose host's clock is off this worker's has room
while it beats and none once it stops (the skew played by the peer's process alone, its
``time.time`` moved; the reader is the real one, ``Room.hand_back``)."""

from __future__ import annotations

import signal
import time

import pytest

from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.prefilling import tokens_of
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import SETTINGS_ENV, recording, wait_until
from .prefill_jobs import admitted
from .test_liveness_clock import announced, skewed_worker


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_a_peer_on_a_host_whose_clock_is_off_has_room_while_it_beats_and_none_once_frozen(
    demo_dir, redis_url, tmp_path, skew
):
    """Workers' heartbeats were their own time.time(), read against the reader's: a peer on a host
    more than a lease behind was never live (nothing handed back to it, whatever room it had), one
    ahead stayed live that long after it stopped (requests handed back to a frozen peer). Now the
    beats are on Redis's clock: the peer (a real worker, its process's clock ``skew`` s off) takes
    what this worker cannot hold while it beats, and nothing once it has not beaten for a lease."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=2)
    runtime, store = Runtime.load(settings, "prefill24@test", "prefill", False), Lifecycle.connect(redis_url)
    room = Room(runtime, Prefetch(), to_prefill(runtime, recording([], "prefill")))
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())  # every prompt waits here
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(demo_dir), "DAYZERO_REDIS_URL": redis_url}
    peer = skewed_worker("prefill", "prefill25", skew, tmp_path / "prefill25.log", env)

    def hand_back(rid: str) -> list[str]:  # -> the requests still waiting here
        loop.intake.submit(admitted(store, rid, tuple(range(2, 302))))
        return [t.job.request.request_id for t in room.hand_back(loop.intake.drain(0), tokens_of, loop.heartbeat)]

    try:
        assert wait_until(lambda: announced(store.r, "prefill", "prefill25"), 120), peer.poll()
        assert hand_back("s-live") == []  # the peer has room
        peer.send_signal(signal.SIGSTOP)
        time.sleep(settings.lease_s + 1)  # its last beat a lease old
        assert hand_back("s-frozen") == ["s-frozen"]  # no live peer: it waits here
    finally:
        loop.stop.set()
        peer.send_signal(signal.SIGCONT)
        peer.terminate()
        peer.wait(60)
        store.r.delete("prefill")  # (the handed-back message, if the peer left it)
