"""Two decode workers, one with every thread busy, after a reconnect and then a burst: does either
hold messages it has not started (waiting for one of its threads) while the other could run them?

bench/prefetch_after_reconnect.py asks this of two prefill workers; here prefill is one worker and
decode two, with DAYZERO_MAX_BATCH=``--batch`` (a decode worker runs twice that many tasks at once: its
Celery pool's threads). Per round it streams twice ``--batch`` long generations (``--tokens`` tokens
each, ignore_eos) to decode0 (decode1 stopped meanwhile: SIGSTOP, its blocked queue read ended), then
closes every worker's broker connection (``CLIENT KILL`` of the connections ``broker.QueueReads``
names; ``--no-kill``: none) and, once they are back, streams ``--burst`` short requests. Reports per
round the burst's times to first token, the most messages each decode worker held unstarted at once
(Celery's ``inspect reserved``, sampled while the burst ran), the requests each held (its leases) at
the burst's start and most at once while it ran, and the requests the gateway's reaper re-ran as lost.
Run: ``python bench/prefetch_two_decode.py [--rounds 3] [--batch 2] [--burst 2] [--tokens 1500]
[--no-kill]``; before/after: run it from each tree's folder with PYTHONPATH at it.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import threading
import time

import httpx
import redis
from celery import Celery
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser
from prefetch_after_reconnect import MODEL, held_by, named_reads, streamed

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


def held_back(stack: Stack, r: redis.Redis, name: str):
    """Worker ``name`` stopped (SIGSTOP: it sends no queue read meanwhile) and the read it sent ended
    (nil); its process, to continue."""
    proc = stack.child(name).proc
    proc.send_signal(signal.SIGSTOP)
    blocked = [c["id"] for c in r.client_list(_type="normal") if c.get("name", "").startswith("dayzero-reads-")]
    for reader in blocked:
        r.client_unblock(reader)
    return proc


def reconnected(r: redis.Redis) -> None:
    """Every worker's broker connection closed (``CLIENT KILL``), and each back (Celery: ~0.1 s)."""
    workers = named_reads(r)
    for reader in [c["id"] for c in r.client_list() if c.get("name", "").startswith("dayzero-reads-")]:
        r.execute_command("CLIENT", "KILL", "ID", reader)
    while named_reads(r) != workers:
        time.sleep(0.005)


def one_round(stack: Stack, app: Celery, args: argparse.Namespace) -> dict:
    r = redis.Redis.from_url(stack.redis_url)
    longs, bursts = {}, {}
    while len(named_reads(r)) < 3:  # every worker's consumer connected
        time.sleep(0.05)
    idle = held_back(stack, r, "decode1")  # the long generations go to decode0
    busy = 2 * args.batch  # (decode0's threads)
    threads = [threading.Thread(target=generation, args=(stack.url, args.tokens, longs, i)) for i in range(busy)]
    for t in threads:
        t.start()
    while held_by(r, "decode") < busy:
        time.sleep(0.005)
    idle.send_signal(signal.SIGCONT)
    if not args.no_kill:
        reconnected(r)
    burst = [threading.Thread(target=streamed, args=(stack.url, [0, 5 + i, 6], bursts, i)) for i in range(args.burst)]
    for t in burst:
        t.start()
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
    ap = bench_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--burst", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--no-kill", action="store_true")
    args = ap.parse_args()
    settings = {**QUICK_LEASES, "DAYZERO_MAX_BATCH": str(args.batch)}
    with scratch() as tmp:
        with demo_stack(tmp, {"vision": 0, "prefill": 1, "decode": 2}, settings, fp4=True) as stack:
            app = Celery(broker=stack.redis_url)
            rounds = [one_round(stack, app, args) for _ in range(args.rounds)]
        reruns = (stack.log_dir / "gateway.log").read_text(errors="replace").count("lost its worker; re-running")
    for n, got in enumerate(rounds):
        firsts = ", ".join(f"{f:.2f}" for f in got["first"])
        unstarted, held, at_start = got["unstarted"], got["held"], got["at_start"]
        print(
            f"round {n}: the burst's first tokens {firsts} s; messages held unstarted (most at once):"
            f" the busy decode0 {unstarted['decode0']}, decode1 {unstarted['decode1']}; requests held (leases)"
            f" at the burst's start / most at once: decode0 {at_start['decode0']} / {held['decode0']},"
            f" decode1 {at_start['decode1']} / {held['decode1']}"
        )
    slowest = statistics.median(got["first"][-1] for got in rounds)
    print(f"median of each round's slowest first token of the burst: {slowest:.2f} s")
    print(f"requests re-run by the reaper (a message taken, never claimed: 'lost its worker'): {reruns}")


if __name__ == "__main__":
    main()
