"""Two decode workers, one with every thread busy, after a reconnect and then a burst: does either
hold messages it has not started (waiting for one of its threads) while the other could run them?

bench/prefetch_after_reconnect.py asks this of two prefill workers; here prefill is one worker and
decode two, with DAYZERO_MAX_BATCH=``--batch`` (a decode worker runs twice that many tasks at once: its
Celery pool's threads). Per round it streams twice ``--batch`` long generations (``--tokens`` tokens
each, ignore_eos) to decode0 (decode1 stopped meanwhile: SIGSTOP, its blocked queue read ended), then
closes every worker's broker connection (``CLIENT KILL`` of the connections ``queue_reads.QueueReads``
names; ``--no-kill``: none) and, once they are back, streams ``--burst`` short requests. Reports per
round the burst's times to first token, the most messages each decode worker held unstarted at once
(Celery's ``inspect reserved``, sampled while the burst ran), the requests each held (its leases) at
the burst's start and most at once while it ran, and the requests the gateway's reaper re-ran as lost.
Run: ``python bench/prefetch_two_decode.py [--rounds 3] [--batch 2] [--burst 2] [--tokens 1500]
[--no-kill]``; before/after: run it from each tree's folder with PYTHONPATH at it.
"""

from __future__ import annotations

import argparse
import threading
import time

import httpx
import redis
from celery import Celery
from prefetch_after_reconnect import MODEL, burst_summary, busy_then_burst, run_rounds
from prefetch_after_reconnect import parser as reconnect_parser

from dayzero.stack import Stack

DECODE = ("decode0", "decode1")


def generation(url: str, tokens: int, out: dict, i: int) -> None:
    """A long streamed generation (``tokens`` tokens), its answer read to the end."""
    body = {"model": MODEL, "prompt": [0, 9, i + 3], "max_tokens": tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for _ in r.iter_lines():
            pass
    out[i] = time.monotonic()


def holders(r: redis.Redis) -> dict[str, int]:
    """How many requests each decode worker holds (their leases name it first)."""
    leases = [(r.get(k) or b"").decode() for k in r.scan_iter("dz:lease:*")]
    return {name: sum(lease.startswith(name) for lease in leases) for name in DECODE}


def one_round(stack: Stack, app: Celery, args: argparse.Namespace) -> dict:
    r = redis.Redis.from_url(stack.redis_url)
    longs, bursts = {}, {}
    busy = 2 * args.batch  # (decode0's threads)
    threads = [threading.Thread(target=generation, args=(stack.url, args.tokens, longs, i)) for i in range(busy)]
    burst = busy_then_burst(stack, r, args, "decode1", threads, bursts)  # the long generations go to decode0
    unstarted, held, at_start = dict.fromkeys(DECODE, 0), dict.fromkeys(DECODE, 0), holders(r)
    while any(t.is_alive() for t in burst):
        reserved = app.control.inspect(timeout=0.3).reserved() or {}
        for name in DECODE:
            tasks = [len(t) for worker, t in reserved.items() if worker.partition("@")[0] == name]
            unstarted[name] = max(unstarted[name], *tasks, 0)
        for name, leases in holders(r).items():
            held[name] = max(held[name], leases)
    for t in threads + burst:
        t.join(600)
    began = min(began for began, _, _ in bursts.values())
    return {
        "first": sorted(first - began for _, first, _ in bursts.values()),
        "unstarted": unstarted,
        "held": held,
        "at_start": at_start,
    }


def main() -> None:
    ap = reconnect_parser(__doc__)
    ap.add_argument("--tokens", type=int, default=1500, help="the long generations' tokens")
    args = ap.parse_args()
    rounds, reruns = run_rounds(args, {"vision": 0, "prefill": 1, "decode": 2}, {}, one_round)
    for n, got in enumerate(rounds):
        firsts = ", ".join(f"{f:.2f}" for f in got["first"])
        unstarted, held, at_start = got["unstarted"], got["held"], got["at_start"]
        print(
            f"round {n}: the burst's first tokens {firsts} s; messages held unstarted (most at once):"
            f" the busy decode0 {unstarted['decode0']}, decode1 {unstarted['decode1']}; requests held (leases)"
            f" at the burst's start / most at once: decode0 {at_start['decode0']} / {held['decode0']},"
            f" decode1 {at_start['decode1']} / {held['decode1']}"
        )
    burst_summary(rounds, reruns)


if __name__ == "__main__":
    main()
