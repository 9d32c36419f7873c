"""The heartbeat against a real Redis: held leases stay alive, released and finished ones lapse; a
slow decode step keeps its requests, a hung step (decode's or prefill's) loses them."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.params import SamplingParams
from dayzero.procs import free_port
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lease import Heartbeat
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs, wait_until


def test_one_thread_keeps_held_leases_alive_until_they_are_released(redis_url):
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    others = {t for t in threading.enumerate() if t.name == "heartbeat"}  # other tests' loops, ending
    beat = Heartbeat(store, "prefill0", 0.3, stop)
    for rid in ("h1", "h2"):
        store.take(rid, 0, "prefill0", 0.3)  # claimed, as a stage claims what it works on
    try:
        with beat.holding(["h1", "h2"]):
            time.sleep(0.5)  # past one lease: only beats keep them
            assert store.owner("h1") == store.owner("h2") == "prefill0"
            beat.release("h2")
            time.sleep(0.5)
            assert store.owner("h1") == "prefill0" and store.owner("h2") is None
            store.take("h3", 0, "prefill0", 0.3)
            with beat.holding(["h3"]):  # a second batch on the same thread
                time.sleep(0.5)
                assert store.owner("h3") == "prefill0"
        time.sleep(0.5)
        assert store.owner("h1") is None and store.owner("h3") is None
    finally:
        stop.set()
    beats = [t for t in threading.enumerate() if t.name == "heartbeat" and t not in others]
    assert len(beats) == 1  # one thread for both batches; it ends with the stop
    beats[0].join(2)
    assert not beats[0].is_alive()


def test_a_lease_lost_during_long_work_is_logged_once_not_at_every_beat(redis_url, caplog):
    """A lease lost while its run works on (re-run elsewhere) stays beaten, and reported lost, until
    its owner drops the run: the warning comes once (it came at every beat: 26 lines in 9 s)."""
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    beat = Heartbeat(store, "prefill0", 0.3, stop)
    store.take("lost1", 0, "prefill0", 0.3)
    try:
        with caplog.at_level("WARNING", logger="dayzero.lease"), beat.holding(["lost1"]):
            store.r.set(key("lease", "lost1"), "prefill1", px=5000)  # re-run: another worker holds it now
            time.sleep(1.0)  # three beats and more
    finally:
        stop.set()
    assert [r.getMessage() for r in caplog.records if "leases lost" in r.getMessage()] == [
        "leases lost during a long piece of work: lost1"
    ]


def test_a_lease_lost_again_after_its_worker_held_nothing_is_logged_again(redis_url, caplog):
    """Beats holding nothing skip Redis (a6494c4), and skipped forgetting the leases the last beat
    found lost: the same request, dropped, taken again (its re-run) and lost again went unlogged."""
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    beat = Heartbeat(store, "prefill0", 0.3, stop)
    try:
        with caplog.at_level("WARNING", logger="dayzero.lease"):
            for attempt in (0, 1):
                store.r.delete(key("lease", "lost2"))  # (the other worker's run ended)
                assert store.take("lost2", attempt, "prefill0", 0.3)
                with beat.holding(["lost2"]):
                    store.r.set(key("lease", "lost2"), "prefill1", px=5000)  # re-run by another worker
                    time.sleep(0.6)  # beats that find it lost
                time.sleep(0.5)  # beats holding nothing
    finally:
        stop.set()
    lost = [r.getMessage() for r in caplog.records if "leases lost" in r.getMessage()]
    assert lost == ["leases lost during a long piece of work: lost2"] * 2, lost


def test_beats_holding_nothing_do_not_say_an_unreachable_redis_is_back(caplog):
    """A worker whose requests ended during an outage beat nothing (no round trip) and logged
    "heartbeats go through again" while Redis was still out (the soak: 1 s into a 15 s and a 45 s
    partition, before its loop's "reaches Redis again")."""
    unreachable = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    store, stop = Lifecycle(unreachable), threading.Event()
    beat = Heartbeat(store, "decode0", 0.3, stop)
    try:
        with caplog.at_level("WARNING", logger="dayzero.lease"):
            with beat.holding(["ended1"]):
                time.sleep(0.5)  # beats that fail: nothing listens there
            time.sleep(0.5)  # beats holding nothing
    finally:
        stop.set()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("heartbeat failed") for m in said), said
    assert not any("go through again" in m for m in said), said


def _admitted(settings: Settings, rid: str, max_tokens: int) -> tuple[Lifecycle, GenerationRequest]:
    """A 4-token prompt, admitted."""
    store = Lifecycle.connect(settings.redis_url)
    request = GenerationRequest(
        request_id=rid,
        prompt_ids=(0, 5, 6, 7),
        sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        created=time.time(),
    )
    store.admit(request, [], "", 60)
    return store, request


def _handed_off(settings: Settings, rid: str, max_tokens: int) -> tuple[Lifecycle, list[DecodeJob]]:
    """A 4-token prompt admitted and prefilled (a prefill loop of its own): decode's job, handed off."""
    (store, request), handed = _admitted(settings, rid, max_tokens), []
    prefill = Runtime.load(settings, f"prefill-{rid}@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(handed)), [PrefillJob(request=request)])
    return store, handed


def test_a_decode_step_longer_than_the_lease_keeps_its_requests(demo_dir, redis_url):
    """A step that outlasts the lease (a first call compiling kernels, a huge batch) must not let the
    leases lapse: decode would drop the requests it is generating and the reaper re-run them."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.4)
    store, handed = _handed_off(settings, "slow-steps", 4)
    decode = Runtime.load(settings, "decode7@test", "decode", False)
    fast = decode.ranks.decode

    def slow(ids: list[str], tokens: list[int]):
        time.sleep(1.0)  # two and a half leases
        return fast(ids, tokens)

    decode.ranks.decode = slow
    run_jobs(DecodeLoop(decode), handed)
    assert store.done("slow-steps") == "length" and len(store.streamed_tokens("slow-steps")) == 4
    assert decode.pools.sequences == {}


def test_a_decode_step_hung_past_the_group_timeout_lets_its_leases_lapse(demo_dir, redis_url):
    """A forward that never returns (a hung kernel) kept its requests' leases alive for ever: the
    reaper never re-ran them, nor did the time limit end them (the loop that checks it was in the
    step), and their streams waited. Past DAYZERO_GROUP_TIMEOUT_S the leases lapse; a step that
    returns after all, its request re-run meanwhile, drops the request, its blocks freed, and ends nothing."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.4, group_timeout_s=1.0)
    store, handed = _handed_off(settings, "hung-step", 6)
    decode = Runtime.load(settings, "decode9@test", "decode", False)
    fast, lapsed = decode.ranks.decode, []

    def hung(ids: list[str], tokens: list[int]):
        if not lapsed:  # hangs until the lease lapses (a bounded wait: a regression fails, never hangs)
            lapsed.append(wait_until(lambda: store.owner("hung-step") is None, 10.0))
            lapsed.append(store.rerun_orphan("hung-step", 60, 60))  # the reaper's re-run: attempt 1
        return fast(ids, tokens)

    decode.ranks.decode = hung
    run_jobs(DecodeLoop(decode), handed)
    assert lapsed == [True, 1]
    assert store.done("hung-step") is None and decode.pools.sequences == {}


def test_a_prefill_forward_hung_past_the_time_limit_lets_its_leases_lapse(demo_dir, redis_url):
    """The same for prefill, whose claimed requests are beaten for until they are handed on; its
    bound is the requests' time limit (a long prompt's forward may rightly pass the group timeout)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.4, group_timeout_s=0.5)
    store, request = _admitted(settings, "long-prefill", 4)
    prefill = Runtime.load(settings, "prefill9@test", "prefill", False)
    fast, held = prefill.ranks.prefill, []

    def long(chunks):  # three group timeouts, within the time limit: still its worker's
        time.sleep(1.5)
        held.append(store.owner("long-prefill"))
        return fast(chunks)

    prefill.ranks.prefill = long
    run_jobs(PrefillLoop(prefill, recording([])), [PrefillJob(request=request)])
    assert held == [prefill.name]
    prefill.settings = settings.model_copy(update={"task_time_limit_s": 1})
    store, request = _admitted(settings, "hung-prefill", 4)
    lapsed = []

    def hung(chunks):
        lapsed.append(wait_until(lambda: store.owner("hung-prefill") is None, 10.0))
        return fast(chunks)

    prefill.ranks.prefill = hung
    run_jobs(PrefillLoop(prefill, recording([])), [PrefillJob(request=request)])
    assert lapsed == [True]


def test_a_decode_that_stalled_while_its_request_was_re_run_writes_nothing_more(demo_dir, redis_url):
    """Decode stalls (a step past its lease) and the reaper re-runs the request; the re-run's prefill
    claims it. The stalled step's tokens are refused, decode drops the request at once (its blocks
    freed) and never ends it: the stream stays the re-run's to continue. Before, the old run streamed
    and ended the request until its heartbeat noticed the lost lease, a beat later."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, handed = _handed_off(settings, "stalled-decode", 6)
    decode = Runtime.load(settings, "decode8@test", "decode", False)
    fast, steps = decode.ranks.decode, []

    def stalling(ids: list[str], tokens: list[int]):
        steps.append(ids)
        if len(steps) == 2:  # meanwhile the lease lapsed, the reaper re-ran it, a prefill claimed it
            store.r.set(key("attempt", "stalled-decode"), 1)
            store.r.set(key("lease", "stalled-decode"), "prefill9@test")
        return fast(ids, tokens)

    decode.ranks.decode = stalling
    run_jobs(DecodeLoop(decode), handed)
    assert len(steps) == 2 and len(store.streamed_tokens("stalled-decode")) == 2  # prefill's, the first step's
    assert store.done("stalled-decode") is None and store.owner("stalled-decode") == "prefill9@test"
    assert decode.pools.sequences == {}


def test_a_re_run_claimed_while_its_stalled_run_prefilled_keeps_its_lease(demo_dir, redis_url):
    """A prefill worker stalls past the lease mid-forward; the reaper re-runs the request and the
    re-run's message comes to the same worker, which claims it while the stalled forward goes on.
    The stalled run, dropped when its forward returned, stopped the beats of the whole request: the
    re-run lost its lease a lease later unless its own prefill was quicker, and was re-run again (a
    soak under faults: a long prompt re-run five times, then failed). The re-run keeps its beats."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", lease_s=0.4)
    store, request = _admitted(settings, "re-run-here", 4)
    prefill = Runtime.load(settings, "prefill5@test", "prefill", False)
    handed, owners, tickets = [], [], []
    loop = PrefillLoop(prefill, recording(handed))
    fast = prefill.ranks.prefill

    def stalling(chunks):
        if not tickets:  # the first run's forward: meanwhile its lease lapsed, it was re-run, the message came here
            out = fast(chunks)  # (a first forward, compiling, may hold the GIL past a lease: the lapse comes after)
            store.r.set(key("attempt", "re-run-here"), 1)
            store.r.delete(key("lease", "re-run-here"))
            tickets.append(loop.intake.submit(PrefillJob(request=request, attempt=1)))
            return out
        time.sleep(1.0)  # the re-run's forward, longer than two leases
        owners.append(store.owner("re-run-here"))
        return fast(chunks)

    prefill.ranks.prefill = stalling
    first = loop.intake.submit(PrefillJob(request=request))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert first.done.wait(120) and wait_until(lambda: tickets, 10.0) and tickets[0].done.wait(120)
    finally:
        loop.stop.set()
        thread.join(30)
    assert owners == [prefill.name]  # still this worker's while the re-run's prefill ran
    assert [job.attempt for job in handed] == [1] and store.owner("re-run-here") == "handoff"
    assert len(store.streamed_tokens("re-run-here")) == 1 and store.done("re-run-here") is None
