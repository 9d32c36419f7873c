"""The no-worker count across a Redis outage: the liveness stamps are writes, so while Redis refuses
writes (or is down, or frozen) every stamp ages. A stage whose count was running when the outage
began (its worker ready for less than PROVEN_S: just started, or restarted) had the whole outage
counted as unserved at Redis's return, before its worker could stamp again: requests that arrived
then, or waited there, were answered 503 ``no_worker`` though the worker had run throughout
(refused for 26 s with a 5 s bound: a 503 ``no_worker`` at 0.6 s after the refusal). Now the
gateway's first pass after a failed one begins each count again. Real processes: Redis, a gateway,
a prefill and a decode worker (prefill frozen at Redis's return, so that it stamps only later)."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from .conftest import MODEL, start_stack
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
