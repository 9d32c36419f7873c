"""How often a worker that gets going during a Redis outage, at a stage nobody served before it,
has the request waiting there ended 503 ``no_worker`` at Redis's return. The gateway's first pass
after the outage keeps that stage's count (``no_worker_count.count_again``: none served it), and the
worker's first stamp comes within a retry (``STAMP_RETRY_S``) of the return: a pass before it took
the stage for unserved. A real stack: the demo checkpoint, embedded Redis, a gateway, one prefill
and one decode worker. Each round: prefill frozen (SIGSTOP) until the stage's count has run past
``FRESH_S`` (count_again's margin: its stamp was stale at the last count), a request admitted, writes
refused past the bound, prefill continued (its stamps refused, retried), then writes taken again at
a random phase of the reaper's passes.

    .venv/bin/python bench/ready_during_outage.py [--rounds 30] [--bound-s 6] [--lease-s 1]
"""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.serving.keys import key
from dayzero.serving.liveness import FRESH_S
from dayzero.serving.no_worker_count import PROVEN_S, unserved_for
from dayzero.stack import Stack

BODY = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 4}


def one_round(stack: Stack, bound_s: float, period_s: float) -> str:
    """The answer to a request waiting at prefill through one round: "200" or "503 <code>"."""
    prefill, r = stack.child("prefill0").proc, redis.Redis.from_url(stack.redis_url)
    prefill.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while (counted := unserved_for(r, "prefill")) <= FRESH_S and time.monotonic() < deadline:
            time.sleep(0.05)  # (its stamp older than count_again's margin: the stage unserved at the last count)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, f"{stack.url}/v1/completions", json=BODY, timeout=120)
            while not r.scard(key("active")) and time.monotonic() < deadline + 30:  # (admitted before the outage)
                time.sleep(0.05)
            r.config_set("maxmemory", 1)
            try:
                time.sleep(bound_s - counted + 0.5)  # (the count past the bound)
                prefill.send_signal(signal.SIGCONT)  # it runs again: its stamps refused, retried
                time.sleep(random.uniform(0.3, 0.3 + period_s))
            finally:
                r.config_set("maxmemory", 0)
            result = answer.result()
        return "200" if result.status_code == 200 else f"{result.status_code} {result.json()['error']['code']}"
    finally:
        prefill.send_signal(signal.SIGCONT)
        stack.wait_ready(timeout_s=60)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--bound-s", type=float, default=6.0, help="DAYZERO_NO_WORKER_TIMEOUT_S")
    parser.add_argument("--lease-s", type=float, default=1.0, help="DAYZERO_LEASE_S (a reaper pass every half)")
    parser.add_argument("--keep", default="", help="a folder to keep the checkpoint and logs in")
    args = parser.parse_args()
    settings = {**QUICK_LEASES, "DAYZERO_LEASE_S": str(args.lease_s), "DAYZERO_NO_WORKER_TIMEOUT_S": str(args.bound_s)}
    with scratch(args.keep) as folder, demo_stack(Path(folder), {"prefill": 1, "decode": 1}, settings) as stack:
        time.sleep(PROVEN_S)  # (one ready for less pauses its count, not ends it: no_worker_count.unserved_for)
        answers = []
        for _ in range(args.rounds):
            answers.append(one_round(stack, args.bound_s, args.lease_s / 2))
            print(answers[-1], end=" ", flush=True)
    ended, admitted = answers.count("503 no_worker"), [a for a in answers if a != "503 queue_unavailable"]
    print(  # (a request that came to the refusal before its admission: not a round)
        f"lease {args.lease_s:g} s, bound {args.bound_s:g} s: {ended} of {len(admitted)} admitted ended no_worker "
        f"at Redis's return ({100 * ended / max(len(admitted), 1):.0f} %): {', '.join(sorted(set(answers)))}"
    )


if __name__ == "__main__":
    main()
