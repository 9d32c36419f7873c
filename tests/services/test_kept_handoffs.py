"""Prefill's kept handoffs at its worker's stop (a real Redis, in-process prefill and decode loops, shm
handoff): the state stays in the stopping worker's pool segment till decode has copied it."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.loop_stage import LoopStage
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted


def _prefilled_stage(settings: Settings, rid: str, reruns: list) -> tuple[LoopStage, list]:
    """A prefill loop stage that prefilled ``rid`` (4 tokens) and handed it off, its loop ended as a
    stop ends it. -> the stage (its re-runs recorded in ``reruns``), decode's jobs."""
    runtime, handed = Runtime.load(settings, f"prefill-{rid}@test", "prefill", True), []
    loop = PrefillLoop(runtime, recording(handed))
    stage = LoopStage(runtime, loop, lambda *run: reruns.append(run) or True, loop.handed_off)
    ticket = loop.intake.submit(admitted(runtime.store, rid))
    thread = threading.Thread(target=stage.run_forever)
    thread.start()
    assert ticket.done.wait(120)
    loop.stop.set()
    thread.join(30)
    assert stage.ended and len(handed) == 1 and loop.handed_off.held  # (kept: decode has not copied it)
    return stage, handed


def test_a_stopping_prefill_worker_keeps_its_handoff_till_decode_has_taken_it(demo_dir, redis_url):
    """SIGTERM right after a handoff: the hand back returned at once and the process closed (its pool
    segment unlinked), decode's attach raised LookupError ("prefill's pool segment ... is gone"), the
    lease lapsed and a sweep re-ran the request from scratch. Now the stop waits for decode's copy
    (here 0.5 s later), and the request ends from the one prefill."""
    settings, reruns = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="shm"), []
    stage, handed = _prefilled_stage(settings, "kept-stop", reruns)
    decode = DecodeLoop(Runtime.load(settings, "decode-kept-stop@test", "decode", False))
    late = threading.Timer(0.5, run_jobs, (decode, handed))
    late.start()
    try:
        stage.hand_back(time.monotonic() + 30)
        stage.close()  # (the process's end: its segment unlinked)
    finally:
        late.join(120)
        decode.r.close()
    store = stage.runtime.store
    assert store.done("kept-stop") == "length" and len(store.streamed_tokens("kept-stop")) == 4
    assert not reruns and handed[0].attempt == 0 and not store.r.exists(key("attempt", "kept-stop"))  # no re-run
    assert not stage.loop.handed_off.held


def test_a_stopping_prefill_worker_leaves_its_handoff_at_its_bound_or_with_redis_gone(demo_dir, redis_url):
    """No decode takes it: the wait ends at ``until`` (the grace less the close's margin); Redis failing
    ends it at once, not at each poll's timeout till then. Left kept, to the reaper (as before)."""
    settings, reruns = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="shm"), []
    stage, _ = _prefilled_stage(settings, "kept-unclaimed", reruns)
    start = time.monotonic()
    stage.hand_back(start + 0.3)
    waited = time.monotonic() - start
    store = stage.runtime.store

    asked: list = []

    def refused(*_):
        asked.append(_)
        raise redis.ConnectionError("Redis went away")

    store.released = refused
    stage.hand_back(time.monotonic() + 600)
    stage.close()
    assert waited >= 0.3 and len(asked) == 1  # (not asked again till the bound)
    assert not reruns and stage.loop.handed_off.held


def test_a_stop_past_its_bound_still_asks_once_what_decode_took(demo_dir, redis_url, caplog):
    """The bound already past at the hand back (a grace of 1 s or less; leaving took that long): the
    handoffs were not asked about at all, and every one decode had taken since the loop's last reclaim
    was logged as 'not taken ... left to the reaper'. Asked once: the one decode took is let go."""
    settings, reruns = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="shm"), []
    stage, handed = _prefilled_stage(settings, "kept-taken", reruns)
    decode = DecodeLoop(Runtime.load(settings, "decode-kept-taken@test", "decode", False))
    try:
        run_jobs(decode, handed)  # decode copies it before the stop's hand back
    finally:
        decode.r.close()
    with caplog.at_level("WARNING", logger="dayzero.prefill"):
        stage.hand_back(time.monotonic() - 1)
    stage.close()
    assert stage.runtime.store.done("kept-taken") == "length" and not reruns
    assert not stage.loop.handed_off.held and "not taken" not in caplog.text
