"""A state carried through Redis (handoff=redis, prefill and decode on different hosts) lives as long
as a decode worker holds its claim, and no longer: a claimed request waiting in decode (for room in
its pools, for its grammar) past the handoff's timeout found its state expired and was re-prefilled."""

from __future__ import annotations

import hashlib
import threading
import time

import redis

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.intake import Ticket
from dayzero.serving.keys import key
from dayzero.serving.lease import Heartbeat
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob, SamplingParams
from dayzero.serving.parked import park
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import HEARTBEAT, TAKE
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .test_lease import _admitted


def _waits_claimed(demo_dir: str, redis_url: str, rid: str, decode_handoff: str) -> Lifecycle:
    """A handoff=redis prefill hands ``rid`` (3 tokens) off with a 1.5 s timeout; a decode worker of
    ``decode_handoff`` claims it as it arrives, then waits 3 s (its grammar) before importing it."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.4, handoff_timeout_s=1.5)
    decode_settings = settings.model_copy(update={"handoff": decode_handoff})
    decode = Runtime.load(decode_settings, f"decode-{rid}@test", "decode", False)  # (first: claims at once)
    (store, request), handed = _admitted(settings, rid, 3), []
    prefill = Runtime.load(settings, f"prefill-{rid}@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(handed)), [PrefillJob(request=request)])
    ready_at, ready = time.monotonic() + 3.0, decode.grammar_ready
    decode.grammar_ready = lambda ticket: time.monotonic() > ready_at and ready(ticket)  # waits, claimed
    run_jobs(DecodeLoop(decode), handed)
    return store


def test_a_claimed_request_waiting_in_decode_past_the_handoff_timeout_keeps_its_state(demo_dir, redis_url):
    """The state must still be there once decode imports it (it expired: "handoff state ...
    expired", the request left to lapse and be re-run from prefill)."""
    store = _waits_claimed(demo_dir, redis_url, "waits-claimed", "redis")
    assert store.done("waits-claimed") == "length" and len(store.streamed_tokens("waits-claimed")) == 3
    assert not store.r.exists(key("kvstate", "waits-claimed"))  # taken, and the request ended


def test_a_decode_worker_left_at_its_own_handoff_setting_keeps_a_redis_carried_state(demo_dir, redis_url):
    """Only prefill's DAYZERO_HANDOFF picks the transport (decode reads whatever the handoff names):
    a decode worker left at its device's default (shm on a CPU, cuda_ipc on a GPU) on another host
    than a handoff=redis prefill claims a state parked in Redis all the same, and keeps it alive."""
    store = _waits_claimed(demo_dir, redis_url, "waits-default", "shm")
    assert store.done("waits-default") == "length" and len(store.streamed_tokens("waits-default")) == 3


def test_a_held_state_is_beaten_with_its_lease_and_lapses_with_it_once_its_holder_is_gone(redis_url):
    """The claim and each beat keep the parked state alive for a lease; once nobody beats (its decode
    worker died) it lapses with the lease, as it would unclaimed."""
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    store.r.set(key("attempt", "held-state"), 0)
    park(store, "kvstate", "held-state", b"state", 0.2)
    store.r.set(key("lease", "held-state"), "handoff", px=200)
    beat = Heartbeat(store, "decode0", 0.4, stop)  # (decode's, handoff=redis)
    beat.state_parked("held-state")
    try:
        store.take("held-state", 0, "decode0", 0.4, handed_off=True, parked=True)
        with beat.holding(["held-state"]):
            time.sleep(1.0)  # five times the state's own TTL: only the claim and the beats keep it
            assert store.r.get(key("kvstate", "held-state")) == b"state"
        time.sleep(0.8)  # two leases with no beat
        assert not store.r.exists(key("kvstate", "held-state"))
    finally:
        stop.set()


def _monitored(url: str, lines: list[str], watching: threading.Event, stop: threading.Event) -> None:
    with redis.Redis.from_url(url).monitor() as monitor:  # (MONITOR answered OK: each command from now on)
        watching.set()
        for command in monitor.listen():
            lines.append(command["command"])
            if stop.is_set():
                return


def _watched(settings: Settings, rid: str, max_tokens: int) -> tuple[Lifecycle, list[str]]:
    """``rid`` prefilled, then claimed by decode as it arrives, beaten 0.6 s while it waits (its
    grammar), imported and generated; -> its store and Redis's commands from the claim on (MONITOR)."""
    decode = Runtime.load(settings, f"decode-{rid}@test", "decode", False)
    (store, request), handed = _admitted(settings, rid, max_tokens), []
    prefill = Runtime.load(settings, f"prefill-{rid}@test", "prefill", True)  # (shm: its pools in a shared segment)
    lines, watching, stop = [], threading.Event(), threading.Event()
    watcher = threading.Thread(target=_monitored, args=(settings.redis_url, lines, watching, stop), daemon=True)
    try:
        run_jobs(PrefillLoop(prefill, recording(handed)), [PrefillJob(request=request)])
        watcher.start()
        assert watching.wait(30)  # (a fixed sleep missed decode's claim on a loaded machine)
        ready_at, ready = time.monotonic() + 0.6, decode.grammar_ready
        decode.grammar_ready = lambda ticket: time.monotonic() > ready_at and ready(ticket)  # beaten, claimed
        run_jobs(DecodeLoop(decode), handed)
    finally:
        stop.set()
        store.r.ping()  # (the monitor's loop sees ``stop``)
        if watcher.is_alive():
            watcher.join(5)
        prefill.close()
    assert store.done(rid) == "length"
    return store, lines


def test_shm_claims_and_beats_touch_no_parked_state(demo_dir, redis_url):
    """With handoff=shm no state is ever parked in Redis: decode's claim and its beats (the claimed
    request waiting, then generating) name no kvstate key and run no command on one (each beat read
    every held request's: bench/heartbeat_keys.py). Watched through Redis's MONITOR."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="shm", lease_s=0.3)
    _, lines = _watched(settings, "shm-beaten", 8)
    take_sha, beat_sha = (hashlib.sha1(script.encode()).hexdigest() for script in (TAKE, HEARTBEAT))
    assert sum(take_sha in line for line in lines) == 1 and sum(beat_sha in line for line in lines) >= 2
    kvstate = key("kvstate", "shm-beaten")
    assert [line for line in lines if kvstate in line and ("PTTL" in line or "PEXPIRE" in line)] == []
    assert [line for line in lines if (take_sha in line or beat_sha in line) and "kvstate" in line] == []


def test_beats_name_a_redis_carried_state_no_more_once_decode_imported_it(demo_dir, redis_url):
    """handoff=redis: decode's claim and its beats while the request waits keep its parked state
    alive; once decode imported it (read and deleted) the beats of the generating request name its
    kvstate no more (each named it, a PTTL on a missing key per request per beat: every request a
    decode worker generated once it had claimed one state through Redis). Watched through MONITOR."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.3)
    _, lines = _watched(settings, "imported-beaten", 200)
    kvstate, beat_sha = key("kvstate", "imported-beaten"), hashlib.sha1(HEARTBEAT.encode()).hexdigest()
    [imported] = [i for i, line in enumerate(lines) if "GETDEL" in line and kvstate in line]
    beats = [(i, kvstate in line) for i, line in enumerate(lines) if beat_sha in line]
    assert any(named for i, named in beats if i < imported)  # (waiting, claimed: its state kept alive)
    after = [named for i, named in beats if i > imported]
    assert after and not any(after)  # (beats came while it generated, none named the state)


def test_a_stale_delivery_claimed_beside_a_waiting_run_leaves_its_parked_state_kept_alive(redis_url):
    """A decode worker holds run 1 of a request, its state parked in Redis and waiting (for blocks);
    a stale message of run 0 comes to it (the dead run's, delivered again), whose claim is refused:
    run 1's state is still parked and its beats keep it alive (the refused claim dropped it from the
    beats: it lapsed with the handoff's timeout, before decode imported it)."""
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    store.r.set(key("attempt", "stale-beside"), 1)
    park(store, "kvstate", "stale-beside", b"state", 0.2)
    store.r.set(key("lease", "stale-beside"), "handoff", px=200)
    beat = Heartbeat(store, "decode0", 0.4, stop)
    request = GenerationRequest(request_id="stale-beside", prompt_ids=(0, 5), sampling=SamplingParams(), created=0)
    run, stale = (Ticket(PrefillJob(request=request, attempt=attempt)) for attempt in (1, 0))
    try:
        assert beat.claim(run, lambda ticket: None, handed_off=True, parked=True)
        assert not beat.claim(stale, lambda ticket: None, handed_off=True, parked=True)
        time.sleep(1.0)  # five times the state's own TTL: only run 1's beats keep it
        assert store.r.get(key("kvstate", "stale-beside")) == b"state"
    finally:
        stop.set()


def test_a_stale_delivery_refused_beside_a_generating_run_adds_no_state_to_its_beats(redis_url):
    """A decode worker holds run 1 of a request whose state decode imported (read out of Redis: its
    beats name it no more); a stale message of run 0 comes (parked, as every handoff's), its claim
    refused: 4fb0b05 kept the request among the parked by its run, and the beats named the missing
    state again while it generated (a PTTL on a missing key per beat: what 0baed68 ended)."""
    store, stop, named = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event(), []
    store.r.set(key("attempt", "stale-generating"), 1)
    park(store, "kvstate", "stale-generating", b"state", 5.0)
    store.r.set(key("lease", "stale-generating"), "handoff", px=5000)
    beats = store.heartbeat
    store.heartbeat = lambda rids, owner, lease_s, runs, parked=(): (
        named.append(set(parked)) or beats(rids, owner, lease_s, runs, parked)
    )
    beat = Heartbeat(store, "decode0", 0.2, stop)
    request = GenerationRequest(request_id="stale-generating", prompt_ids=(0, 5), sampling=SamplingParams(), created=0)
    run, stale = (Ticket(PrefillJob(request=request, attempt=attempt)) for attempt in (1, 0))
    try:
        assert beat.claim(run, lambda ticket: None, handed_off=True, parked=True)
        store.r.delete(key("kvstate", "stale-generating"))  # (decode imported it)
        beat.state_gone("stale-generating")
        assert not beat.claim(stale, lambda ticket: None, handed_off=True, parked=True)
        named.clear()
        time.sleep(0.6)  # (three beats)
        assert named and not any(named), named
    finally:
        stop.set()
