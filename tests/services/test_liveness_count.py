"""A stage's no-worker count on its workers' liveness stamps, against a real Redis: only a ready
worker serves its stage, so a crash loop (while loading, or soon after its readiness) leaves it
counting; the first worker ready restarts the count; a young worker that served and froze leaves
it counting without the time it served."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import redis

from dayzero.serving import liveness, no_worker_count
from dayzero.serving.keys import key
from dayzero.serving.liveness import FRESH_S, STAMP_EVERY_S, stamps
from dayzero.serving.no_worker_count import count_again, unserved_for

from .conftest import wait_until


def _crashing_worker(redis_url: str, loading_s: float, ready_s: float | None = None) -> None:
    """A worker process that stamps while it loads for ``loading_s``, then (``ready_s``) is ready for
    ``ready_s``, then dies (no clean stop)."""
    code = (
        "import os, sys, time; from dayzero.serving.liveness import Pulse, connect\n"
        "pulse = Pulse(connect(sys.argv[1]), 'prefill').start()\n"
        f"time.sleep({loading_s})\n"
        f"{f'pulse.ready(); time.sleep({ready_s})' if ready_s is not None else ''}\n"
        "os._exit(3)"
    )
    subprocess.run([sys.executable, "-c", code, redis_url], check=False, timeout=60)


def _unserved_while(client: redis.Redis, worker: threading.Thread) -> list[float]:
    """The prefill stage's no-worker count, every 0.1 s, while ``worker`` runs (once it stamped)."""
    worker.start()
    assert wait_until(lambda: stamps(client, "prefill"), 30)
    counts = []
    while worker.is_alive():
        counts.append(unserved_for(client, "prefill"))
        time.sleep(0.1)
    return counts


def test_only_a_ready_worker_serves_its_stage_so_a_crash_loop_leaves_it_unserved(redis_url, monkeypatch):
    """Every stamp counted: a worker dying while it loads, restarted again and again, reset the
    stage's no-worker count at each start, and the requests waiting there waited for ever. Now a
    loading process stamps (dayzero up sees it alive) but serves only once ready. One that dies
    soon after it is ready, again and again (on its first request, say) reset the count at each
    start too: now it pauses the count while it serves (nothing waiting ends) and ends it only
    once it has been ready for PROVEN_S; the first one ready restarts it (it loaded), the next
    ones do not."""
    client = redis.Redis.from_url(redis_url)
    client.delete("dz:unserved:prefill", "dz:restart:prefill")
    assert unserved_for(client, "prefill") < 1.0  # no process yet: the count starts
    began, counts = time.time(), []
    for _ in range(2):  # a crash loop while loading
        counts += _unserved_while(client, threading.Thread(target=_crashing_worker, args=(redis_url, 1.5)))
    since_began = lambda: time.time() - began <= unserved_for(client, "prefill")  # noqa: E731 (the whole time)
    assert 0.0 not in counts and counts == sorted(counts) and since_began()
    for _ in range(2):  # a crash loop past the load
        counts = _unserved_while(client, threading.Thread(target=_crashing_worker, args=(redis_url, 0.5, 1.5)))
        assert 0.0 in counts and client.exists("dz:unserved:prefill")  # served meanwhile, the count kept
    assert wait_until(lambda: unserved_for(client, "prefill") > 0.0, FRESH_S + 2)  # (the last one's stamp stale)
    first_ready = min(float(t) for t in client.hgetall("dz:ready:prefill").values() if float(t) > began)
    served = time.time() - first_ready - unserved_for(client, "prefill")  # (left out: the time they were ready)
    assert 2 * (1.5 - STAMP_EVERY_S) <= served <= 2 * 1.5 + 0.1  # the second one's load and restarts counted
    monkeypatch.setattr(no_worker_count, "PROVEN_S", 1.0)
    worker = threading.Thread(target=_crashing_worker, args=(redis_url, 0.0, 2.5))  # one that serves a while
    counts = _unserved_while(client, worker)
    assert counts[-1] == 0.0 and not client.exists("dz:unserved:prefill")  # served: a new count when it is gone
    assert wait_until(lambda: unserved_for(client, "prefill") > 0.0, FRESH_S + 2)
    assert unserved_for(client, "prefill") < FRESH_S


def test_the_first_worker_ready_restarts_the_count_so_its_death_waits_for_its_restart(redis_url):
    """A slow first load (the stage unserved all along), then its worker killed within PROVEN_S of
    its readiness: the load was counted, and the 8 requests waiting there ended at once, "no
    prefill worker ... for 63 s", where its restart served them ~30 s later. The first process
    ready since the count began restarts it from its readiness (it loaded: a start, not a crash
    loop), for good: its entries gone (forgotten, or a restart under the same id) change nothing."""
    client = redis.Redis.from_url(redis_url)
    client.delete("dz:unserved:prefill", "dz:restart:prefill", "dz:alive:prefill", "dz:ready:prefill")
    assert unserved_for(client, "prefill") < 1.0  # no process yet: the count starts
    time.sleep(1.0)  # (a long first load: with the worker's 1 s, 2 s before it is ready)
    counts = _unserved_while(client, threading.Thread(target=_crashing_worker, args=(redis_url, 1.0, 1.5)))
    assert 0.0 in counts
    assert wait_until(lambda: unserved_for(client, "prefill") > 0.0, FRESH_S + 2)  # (its stamp stale)
    (process, ready_at), last = client.hgetall("dz:ready:prefill").popitem(), stamps(client, "prefill")
    unserved = unserved_for(client, "prefill")
    assert unserved <= time.time() - last[process.decode()]  # counted from its readiness, less the time it served
    client.hdel("dz:ready:prefill", process)  # (as a restart under the same id does)
    unserved = unserved_for(client, "prefill")
    assert unserved <= time.time() - float(ready_at)  # (now counted: the time it served)


def test_a_young_worker_that_served_and_froze_leaves_its_stage_counting_without_the_time_it_served(redis_url):
    """A worker ready for less than PROVEN_S that stops stamping (frozen, or dead): the stage's count
    goes on without the time it served (from its readiness to its last stamp), not through it (a
    decode that served 9 s and froze had its waiting requests ended ~3 s later, counted from the
    stack's start)."""
    client = redis.Redis.from_url(redis_url)
    client.delete("dz:unserved:prefill", "dz:restart:prefill")
    assert unserved_for(client, "prefill") < 1.0  # no process serves: the count starts
    began = time.time()
    counts = _unserved_while(client, threading.Thread(target=_crashing_worker, args=(redis_url, 0.0, 5.0)))
    assert 0.0 in counts  # it served
    assert wait_until(lambda: unserved_for(client, "prefill") > 0.0, FRESH_S + 2)  # (its stamp stale)
    assert unserved_for(client, "prefill") <= time.time() - began - (5.0 - STAMP_EVERY_S)


def test_an_outage_keeps_the_count_of_a_stage_nobody_served_since_its_last_count(redis_url):
    """After a Redis outage (``count_again``) every stage's count began again, one that had no worker
    before the outage and none after too: what waited there waited one more no-worker bound after it
    (a 4 s bound, writes refused 4 s: its 503 ``no_worker`` 4.2 s after the refusal). Now such a stage
    keeps its count; one that a ready process served at its last count or since begins again (its
    stamps aged through the outage)."""
    client = redis.Redis.from_url(redis_url)
    stages, families = ("vision", "prefill", "decode"), ("unserved", "restart", "counted", "alive", "ready")
    client.delete(*(key(family, stage) for stage in stages for family in families))
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    client.hset(key("alive", "prefill"), "host:1", repr(now - 60))  # its only worker dead a minute
    client.hset(key("ready", "prefill"), "host:1", repr(now - 70))
    assert all(unserved_for(client, stage) < 1.0 for stage in stages)  # each stage's count begins
    client.hset(key("alive", "decode"), "host:2", repr(now + 1))  # ready after decode's last count
    client.hset(key("ready", "decode"), "host:2", repr(now + 1))
    client.hset(key("alive", "vision"), "host:3", repr(now - FRESH_S / 2))  # served at vision's last count
    client.hset(key("ready", "vision"), "host:3", repr(now - 5))
    began = client.get(key("unserved", "prefill"))
    time.sleep(0.01)
    seconds, micros = client.time()
    count_again(client, stages, seconds + micros / 1e6)
    assert client.get(key("unserved", "prefill")) == began  # (was: begun again)
    assert not client.exists(key("unserved", "decode"), key("unserved", "vision"))


def test_the_time_a_young_worker_served_stays_out_of_the_count_after_its_stamps_are_old(redis_url, monkeypatch):
    """Its stamps left the hashes ``FORGET_S`` after its last (a restart stamps under a new pid), and
    with them the time it served, which the count took for time unserved again: a count past 600 s (a
    bound above it: a long load) jumped by that time. Now a ready process's stamps stay while its
    stage's count runs. Stamps written as a worker's: it served 5 s, from 13 s ago to 8 s ago."""
    client, stage = redis.Redis.from_url(redis_url), "vision"
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    client.delete(*(key(family, stage) for family in ("alive", "ready", "unserved", "restart", "counted")))
    client.set(key("unserved", stage), repr(now - 20))  # (a count begun before it was ready)
    client.hset(key("alive", stage), "host:1", repr(now - 8))
    client.hset(key("ready", stage), "host:1", repr(now - 13))
    counted = unserved_for(client, stage)  # from its readiness (a start that loaded), less the 5 s it served
    assert 8 <= counted < 9
    monkeypatch.setattr(liveness, "FORGET_S", 6.0)  # (its stamps now as old)
    assert unserved_for(client, stage) < counted + 1  # (was: + 5, the time it served)
    assert client.hexists(key("ready", stage), "host:1")
    client.delete(key("unserved", stage), key("restart", stage))  # no count: its stamps go
    monkeypatch.setattr(no_worker_count, "PROVEN_S", 0.0)  # (no count begins: as if a proven one served)
    client.hset(key("alive", stage), "host:2", repr(now))
    client.hset(key("ready", stage), "host:2", repr(now))
    assert unserved_for(client, stage) == 0.0
    assert not client.hexists(key("ready", stage), "host:1") and not client.hexists(key("alive", stage), "host:1")
