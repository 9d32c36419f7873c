"""A lease that lapsed while its worker went on (Redis out, or a step run, past a lease) is taken back
by the worker's next heartbeat when no re-run of the request began: the reaper re-ran it (a re-prefill)
and the worker dropped its copy after every such outage. A re-run that began wins: the old holder's
beat finds its lease lost, and the re-run's worker takes it."""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import httpx
import redis

from dayzero.params import SamplingParams
from dayzero.serving.first_tokens import FirstTokens
from dayzero.serving.intake import Ticket
from dayzero.serving.keys import key
from dayzero.serving.lease import Heartbeat
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.scripts import Take

from .conftest import MODEL, sse_events, start_gateway_alone, start_stack, wait_until
from .test_decode_appends import writes_refused


def _taken_and_lapsed(store: Lifecycle, rids: list[str]) -> None:
    """Admitted, taken by decode0 (run 0), and their leases lapsed."""
    for rid in rids:
        request = GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0)
        store.admit(request, [], "", 60)
        assert store.take(rid, 0, "decode0", 30) == Take.CLAIMED
        store.r.delete(key("lease", rid))


def test_a_heartbeat_takes_back_a_lapsed_lease_no_re_run_began_and_the_reaper_re_runs_nothing(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    _taken_and_lapsed(store, ["tb-lapsed"])
    assert store.heartbeat(["tb-lapsed"], "decode0", 30, {"tb-lapsed": 0}) == []
    assert store.owner("tb-lapsed") == "decode0" and store.r.pttl(key("lease", "tb-lapsed")) > 10_000
    assert store.rerun_orphan("tb-lapsed", 60, 60) == 0  # held again: nothing to re-run


def test_a_re_run_that_began_wins_and_an_ended_or_queued_run_is_not_taken_back(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    rids = ["tb-rerun", "tb-ended", "tb-queued", "tb-unknown"]
    _taken_and_lapsed(store, rids)
    assert store.rerun_orphan("tb-rerun", 60, 60) == 1  # the reaper got there first: attempt 1
    store.settle("tb-ended", 0, "", "cancelled")
    store.hand_on("tb-queued", 0, "", "prefill", "message", 60)  # its message waits for a worker
    runs = {"tb-rerun": 0, "tb-ended": 0, "tb-queued": 0}  # (tb-unknown: no run known, refreshed only)
    assert store.heartbeat(rids, "decode0", 30, runs) == rids
    assert [store.owner(rid) for rid in rids] == [None] * 4  # none taken back
    assert store.take("tb-rerun", 1, "decode1", 30) == Take.CLAIMED  # the re-run's worker holds it
    assert store.heartbeat(["tb-rerun"], "decode0", 30, {"tb-rerun": 0}) == ["tb-rerun"]
    assert store.owner("tb-rerun") == "decode1"


BODY = {"model": MODEL, "prompt": [0, 5, 4, 3, 2], "max_tokens": 120, "temperature": 0, "ignore_eos": True}


def test_redis_refusing_writes_past_a_lease_mid_stream_re_runs_nothing(text_dir, tmp_path):
    """Real Redis and workers, leases of 1 s: Redis refuses writes for three leases (no heartbeat
    lands) with a stream in flight. The decode worker takes its lapsed lease back and carries on:
    every token once, no re-run (the reaper re-ran it, a re-prefill, and decode dropped its copy)."""
    stack = start_stack(text_dir, tmp_path, {"prefill": 1, "decode": 1})
    try:
        expected = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]

        def refused() -> None:
            client = redis.Redis.from_url(stack.redis_url)
            with writes_refused(client):
                time.sleep(3.0)
                lapsed.append(not client.exists(key("lease", rid)))  # (the stream still in flight)

        text, lapsed, fault = [], [], threading.Thread(target=refused)
        with httpx.stream("POST", f"{stack.url}/v1/completions", json={**BODY, "stream": True}, timeout=120) as r:
            rid = r.headers["x-request-id"]
            for _, data in sse_events(r):
                if data == "[DONE]":
                    break
                text.append(data["choices"][0]["text"])
                if len(text) == 10:
                    fault.start()
        fault.join()
        assert lapsed == [True]
        assert "".join(text) == expected  # every token once
        assert redis.Redis.from_url(stack.redis_url).get(key("attempt", rid)) is None  # never re-run
        assert "lease lost" not in (stack.log_dir / "decode0.log").read_text()
    finally:
        stack.stop()


def test_the_reaper_re_runs_nothing_for_a_lease_after_an_outage_so_a_live_worker_takes_its_lease_back(
    demo_dir, tmp_path
):
    """A gateway (its reaper) and Redis; this test is the worker, leases of 1 s. Redis refuses writes
    past the lease: the worker's beat 0.6 s after Redis is back takes its lease back, and the request
    is never re-run. The reaper re-ran it at its first pass (0.5 s apart), before the worker's beat
    (a third of a lease apart) landed, in 1 of 5 outages (bench/lapsed_lease.py)."""
    stack = start_gateway_alone(demo_dir, tmp_path)
    try:
        store = Lifecycle(redis.Redis.from_url(stack.redis_url))
        request = GenerationRequest(
            request_id="beaten-back", prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=time.time()
        )
        store.admit(request, [], "", 60)
        assert store.take("beaten-back", 0, "decode9", 1.0) == Take.CLAIMED
        with writes_refused(store.r):
            time.sleep(2.5)  # the lease lapses; the reaper's passes fail
        time.sleep(0.6)
        runs = {"beaten-back": 0}
        for _ in range(6):  # (a lease and more of beats)
            assert store.heartbeat(["beaten-back"], "decode9", 1.0, runs) == []
            time.sleep(0.3)
        assert store.owner("beaten-back") == "decode9" and store.r.get(key("attempt", "beaten-back")) is None
    finally:
        stack.stop()


def test_a_prefilled_request_whose_send_redis_failed_is_taken_back_after_the_outage(redis_url):
    """Its send releases the request's beats, then Redis fails it: it is held again (beaten while it
    waits for the retry) but was beaten without its run, so a lease that lapsed in the outage was not
    taken back, and the reaper re-ran it: a re-prefill per outage past a lease, the path this change was for."""
    store, stop = Lifecycle(redis.Redis.from_url(redis_url)), threading.Event()
    beat = Heartbeat(store, "prefill0", 0.3, stop)
    sampling = SamplingParams(max_tokens=2)
    request = GenerationRequest(request_id="tb-send", prompt_ids=(0, 5), sampling=sampling, created=0)
    store.admit(request, [], "", 60)
    ticket = Ticket(PrefillJob(request=request))
    first = FirstTokens(None, SimpleNamespace(retry_later=lambda unsent: None), None, beat, None, None, 0)

    def redis_failing(ticket: Ticket[PrefillJob]) -> None:
        raise redis.ConnectionError("Redis down")

    first._emit = redis_failing
    try:
        assert beat.claim(ticket, lambda ticket: None)
        assert first.each([ticket], first.send) == [ticket]  # kept for a retry, held again
        store.r.delete(key("lease", "tb-send"))  # the outage outlasted the lease
        assert wait_until(lambda: store.owner("tb-send") == "prefill0", 2)
    finally:
        stop.set()


def test_a_redis_frozen_past_a_lease_but_within_the_gateways_timeout_re_runs_nothing(demo_dir, tmp_path):
    """Redis frozen (SIGSTOP) for 2.5 s, three leases of 1 s, within the gateway's 10 s command timeout:
    the reaper's pass waits on Redis, fails nothing, and went on re-running the lapsed lease at once when
    Redis came back, before the live worker's next beat (a third of a lease on) could take it back."""
    stack = start_gateway_alone(demo_dir, tmp_path)
    try:
        store = Lifecycle(redis.Redis.from_url(stack.redis_url))
        sampling = SamplingParams(max_tokens=2)
        request = GenerationRequest(request_id="frozen", prompt_ids=(0, 5), sampling=sampling, created=time.time())
        store.admit(request, [], "", 60)
        assert store.take("frozen", 0, "decode9", 1.0) == Take.CLAIMED
        stack.redis.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.5)  # the lease lapses; the reaper's pass waits on Redis
        finally:
            stack.redis.send_signal(signal.SIGCONT)
        time.sleep(0.3)
        for _ in range(6):
            assert store.heartbeat(["frozen"], "decode9", 1.0, {"frozen": 0}) == []
            time.sleep(0.3)
        assert store.owner("frozen") == "decode9" and store.r.get(key("attempt", "frozen")) is None
    finally:
        stack.stop()
