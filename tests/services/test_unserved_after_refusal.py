"""The no-worker count across a Redis outage: the liveness stamps are writes, so while Redis refuses
writes (or is down, or frozen) every stamp ages. A stage whose count was running when the outage
began (its worker ready for less than PROVEN_S: just started, or restarted) had the whole outage
counted as unserved at Redis's return, before its worker could stamp again: requests that arrived
then, or waited there, were answered 503 ``no_worker`` though the worker had run throughout
(refused for 26 s with a 5 s bound: a 503 ``no_worker`` at 0.6 s after the refusal). Now the
gateway's first pass after a failed one begins each count again, for a stage that a worker served
before the outage: one that had none before it and none after keeps its count (it waited one more
bound). Real processes: Redis, a gateway, a prefill and a decode worker (prefill frozen)."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from dayzero.serving.keys import key
from dayzero.serving.no_worker_count import unserved_for

from .conftest import MODEL, start_stack, wait_until
from .test_decode_appends import writes_refused

BOUND_S = 5.0
BODY = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 4}


def test_a_write_refusal_longer_than_the_bound_ends_nothing_as_no_worker(text_dir, tmp_path):
    extra = {"DAYZERO_NO_WORKER_TIMEOUT_S": str(BOUND_S)}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, extra)
    prefill = stack.child("prefill0").proc
    try:  # ready just now: the stages' counts run until their workers have served PROVEN_S
        r = redis.Redis.from_url(stack.redis_url)
        with writes_refused(r):
            refused = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=30)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_unavailable"
            time.sleep(BOUND_S + 2)  # every stamp is older than the bound
            prefill.send_signal(signal.SIGSTOP)  # it stamps again only once continued
        with ThreadPoolExecutor(1) as pool:  # a request while the reaper's passes run (every half lease)
            answer = pool.submit(httpx.post, f"{stack.url}/v1/completions", json=BODY, timeout=60)
            time.sleep(1.5)
            prefill.send_signal(signal.SIGCONT)  # (it waited less than the bound since Redis took writes)
            assert answer.result().status_code == 200, answer.result().text  # (was: 503 no_worker)
    finally:
        prefill.send_signal(signal.SIGCONT)
        stack.stop()


def test_a_request_at_a_stage_without_a_worker_through_a_refusal_ends_at_the_bound_from_before(text_dir, tmp_path):
    """Its stage had no worker before the refusal (its only one frozen) and none after: the first
    pass after the refusal began its count again, and the request waited one more bound (a 4 s
    bound, refused 4 s: 503 ``no_worker`` 4.2 s after the refusal; its worker continued meanwhile
    would have served it). Now the count goes on from before: it ends at the first pass after."""
    extra = {"DAYZERO_NO_WORKER_TIMEOUT_S": str(BOUND_S)}
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1}, extra)
    prefill, r = stack.child("prefill0").proc, redis.Redis.from_url(stack.redis_url)
    try:
        prefill.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: unserved_for(r, "prefill") > 0.0, 10)  # its count runs (its stamp stale)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, f"{stack.url}/v1/completions", json=BODY, timeout=60)
            assert wait_until(lambda: r.scard(key("active")), 10)  # (admitted)
            with writes_refused(r):
                time.sleep(BOUND_S + 1)  # (the count past the bound, the request waiting)
            seconds, micros = r.time()
            back = seconds + micros / 1e6
            assert wait_until(lambda: float(r.get(key("counted", "decode")) or 0) > back, 10)  # a pass after it
            assert wait_until(answer.done, BOUND_S / 2)  # (was: a bound later)
            prefill.send_signal(signal.SIGCONT)
            assert answer.result().status_code == 503 and answer.result().json()["error"]["code"] == "no_worker"
    finally:
        prefill.send_signal(signal.SIGCONT)
        stack.stop()
