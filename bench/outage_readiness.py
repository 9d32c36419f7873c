"""Right after a Redis outage ends: how long ``/ready`` wrongly says "no live worker" (its workers
alive and serving all along: their stamps aged while Redis took no writes), and how long a request
waiting at a stage with no worker (its only worker frozen before the outage) waits after the outage
before its 503 ``no_worker``. A real stack: the demo checkpoint, embedded Redis, a gateway, one
prefill and one decode worker. The outages: writes refused (too few replicas, out of memory), or
Redis frozen (SIGSTOP) or killed and started again (empty), each longer than the stamps' freshness (liveness.FRESH_S).

    .venv/bin/python bench/outage_readiness.py [--rounds 5] [--outage-s 4] [--bound-s 4] [--kinds frozen,...]
"""

from __future__ import annotations

import signal
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.serving.keys import key
from dayzero.serving.no_worker_count import unserved_for
from dayzero.stack import Stack

BODY = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 4}
WATCH_S = 5.0  # /ready is watched this long after an outage (or until it says 200)


REFUSING = {"noreplicas": "min-replicas-to-write", "maxmemory": "maxmemory"}  # a setting of 1 refuses writes
KINDS = (*REFUSING, "frozen", "restarted")


@contextmanager
def outage(stack: Stack, kind: str):
    """Redis takes no writes while inside: ``noreplicas`` / ``maxmemory`` refuse them, ``frozen`` is
    Redis stopped (SIGSTOP), ``restarted`` killed (started again on its port at the end, empty)."""
    r = redis.Redis.from_url(stack.redis_url)
    if kind == "frozen":
        stack.redis.send_signal(signal.SIGSTOP)
    elif kind == "restarted":
        stack.redis.kill()
        stack.redis.wait()
    else:
        r.config_set(REFUSING[kind], 1)
    try:
        yield
    finally:
        if kind == "frozen":
            stack.redis.send_signal(signal.SIGCONT)
        elif kind == "restarted":
            stack.supervise()
        else:
            r.config_set(REFUSING[kind], 0)


def wrong_ready_s(stack: Stack, kind: str, outage_s: float) -> float:
    """Seconds after the outage's end until the last ``/ready`` answer that said "no live worker"
    (0: none did), watched every 10 ms until a 200."""
    with outage(stack, kind):
        time.sleep(outage_s)
    ended, last_wrong = time.monotonic(), None
    while time.monotonic() - ended < WATCH_S:
        answer = httpx.get(f"{stack.url}/ready", timeout=15)
        if answer.status_code == 200:
            break
        if "no live worker" in answer.json().get("reason", ""):
            last_wrong = time.monotonic()
        time.sleep(0.01)
    return 0.0 if last_wrong is None else last_wrong - ended


def no_worker_after_s(stack: Stack, outage_s: float) -> tuple[float, str]:
    """A request waiting at prefill (its worker frozen, the stage's count begun), then writes refused
    for ``outage_s``: seconds from the outage's end to its answer, and the answer's code."""
    prefill, r = stack.child("prefill0").proc, redis.Redis.from_url(stack.redis_url)
    prefill.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while unserved_for(r, "prefill") == 0.0 and time.monotonic() < deadline:  # (its stamp stale)
            time.sleep(0.05)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, f"{stack.url}/v1/completions", json=BODY, timeout=120)
            while not r.scard(key("active")) and time.monotonic() < deadline + 30:  # admitted before the outage
                time.sleep(0.01)  # (a fixed 0.3 s: at load 10 some came after it, refused: 503 queue_unavailable)
            with outage(stack, "maxmemory"):
                time.sleep(outage_s)
            ended = time.monotonic()
            result = answer.result()
            after = time.monotonic() - ended
        code = result.json()["error"]["code"] if result.status_code != 200 else "served"
        return after, f"{result.status_code} {code}"
    finally:
        prefill.send_signal(signal.SIGCONT)
        stack.wait_ready(timeout_s=60)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--outage-s", type=float, default=4.0)
    parser.add_argument("--bound-s", type=float, default=4.0, help="DAYZERO_NO_WORKER_TIMEOUT_S")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"outages for /ready, of {', '.join(KINDS)}")
    parser.add_argument("--keep", default="", help="a folder to keep the checkpoint and logs in")
    args = parser.parse_args()
    settings = {**QUICK_LEASES, "DAYZERO_NO_WORKER_TIMEOUT_S": str(args.bound_s)}
    with scratch(args.keep) as folder, demo_stack(Path(folder), {"prefill": 1, "decode": 1}, settings) as stack:
        for kind in args.kinds.split(","):
            wrong = []
            for _ in range(args.rounds):
                wrong.append(wrong_ready_s(stack, kind, args.outage_s))
                stack.wait_ready(timeout_s=60)
                time.sleep(0.5)
            shown = " ".join(f"{s:.2f}" for s in wrong)
            median = statistics.median(wrong)
            print(f"{kind:>10}: /ready 'no live worker' after the outage: {shown} s (median {median:.2f})")
        for _ in range(args.rounds):
            after, answer = no_worker_after_s(stack, args.outage_s)
            fault = f"prefill frozen, {args.outage_s:.0f} s refusal, bound {args.bound_s:.0f} s"
            print(f"{fault}: {answer} {after:.2f} s after the refusal")


if __name__ == "__main__":
    main()
