"""A worker whose broker connection was lost while it ran requests, then a burst: does it take
messages it cannot start (every thread of its pool busy) while an idle peer could run them?

Starts a stack of 2 prefill workers and 1 decode worker on the demo checkpoint with
DAYZERO_MAX_BATCH=``--batch`` (a prefill worker runs that many tasks at once: its Celery pool's
threads and its prefetch count) and DAYZERO_PREFILL_CHUNK_SIZE=``--chunk`` (a long prompt takes many
steps). Per round it streams ``--batch`` 2,500-token prompts to one prefill worker (the other stopped
meanwhile: SIGSTOP, its blocked queue read ended), then closes every worker's broker connection
(``CLIENT KILL`` of the connections ``queue_reads.QueueReads`` names; ``--no-kill``: none) and, once they
are back, streams ``--burst`` short prompts. Reports per round the burst's times to first token and
the long prompts' (from the burst's start), and the most messages the prefill workers held unstarted
at once (Celery's ``inspect reserved``, sampled while the burst ran: a message waiting for one of its
worker's threads, here the busy worker's, while its peer idled), and the requests the gateway's
reaper re-ran as lost (a message taken off the queue and not claimed within a few leases).
Run: ``python bench/prefetch_after_reconnect.py [--rounds 3] [--batch 2] [--burst 2] [--chunk 64]
[--no-kill]``; before/after: run it from each tree's folder with PYTHONPATH at it (``python -m``
puts the working directory first on the workers' path).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import threading
import time

import httpx
import redis
from celery import Celery
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.stack import Stack

MODEL = "dayzero-demo"
LONG = [(7 * j) % 200 + 3 for j in range(2500)]


def streamed(url: str, prompt: list[int], out: dict, i: int) -> None:
    """A streamed completion of ``prompt``: when it was sent, its first token came, it ended (monotonic)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True}
    began, first = time.monotonic(), None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                first = time.monotonic()
    out[i] = (began, first, time.monotonic())


def held_by(r: redis.Redis, stage: str) -> int:
    """How many requests workers of ``stage`` hold (their leases)."""
    return sum((r.get(k) or b"").startswith(stage.encode()) for k in r.scan_iter("dz:lease:*"))


def named_reads(r: redis.Redis) -> set[str]:
    """The names of the workers' broker connections (one per worker)."""
    return {c["name"] for c in r.client_list() if c.get("name", "").startswith("dayzero-reads-")}


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


def busy_then_burst(
    stack: Stack, r: redis.Redis, args: argparse.Namespace, idle: str, longs: list[threading.Thread], bursts: dict
) -> list[threading.Thread]:
    """A round up to its burst: every worker's consumer connected; worker ``idle`` held back while the
    ``longs`` (started here) are taken by its stage's other worker; ``idle`` let go, every broker
    connection closed and back (``--no-kill``: not); the burst's ``args.burst`` short streams started
    (their times into ``bursts``), returned."""
    while len(named_reads(r)) < 3:  # (ready: its loop announced)
        time.sleep(0.05)
    held = held_back(stack, r, idle)
    for t in longs:
        t.start()
    while held_by(r, stack.child(idle).service) < len(longs):
        time.sleep(0.005)
    held.send_signal(signal.SIGCONT)
    if not args.no_kill:
        reconnected(r)
    burst = [threading.Thread(target=streamed, args=(stack.url, [0, 5 + i, 6], bursts, i)) for i in range(args.burst)]
    for t in burst:
        t.start()
    return burst


def one_round(stack: Stack, app: Celery, args: argparse.Namespace) -> dict:
    r = redis.Redis.from_url(stack.redis_url)
    longs, bursts = {}, {}
    threads = [threading.Thread(target=streamed, args=(stack.url, LONG, longs, i)) for i in range(args.batch)]
    burst = busy_then_burst(stack, r, args, "prefill1", threads, bursts)  # the long prompts go to prefill0
    unstarted = {"prefill0": 0, "prefill1": 0}
    while any(t.is_alive() for t in burst):
        for worker, tasks in (app.control.inspect(timeout=0.3).reserved() or {}).items():
            name = worker.partition("@")[0]
            if name in unstarted:
                unstarted[name] = max(unstarted[name], len(tasks))
    for t in threads + burst:
        t.join(600)
    began = min(began for began, _, _ in bursts.values())
    return {
        "first": sorted(first - began for _, first, _ in bursts.values()),
        "long": sorted(first - began for _, first, _ in longs.values()),  # (prefill done: its first token)
        "unstarted": unstarted,
    }


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of this bench and of bench/prefetch_two_decode.py (a round's own: the caller's)."""
    ap = bench_parser(doc)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2, help="DAYZERO_MAX_BATCH")
    ap.add_argument("--burst", type=int, default=2, help="short requests after the reconnect")
    ap.add_argument("--no-kill", action="store_true", help="no broker connection closed (the control)")
    return ap


def run_rounds(args: argparse.Namespace, workers: dict[str, int], settings: dict[str, str], one_round) -> tuple:
    """``args.rounds`` of ``one_round(stack, app, args)`` on a stack of ``workers`` (short leases,
    DAYZERO_MAX_BATCH ``args.batch``, ``settings``); their results, and how many requests the gateway's
    reaper re-ran as lost (a message taken off the queue and never claimed)."""
    settings = {**QUICK_LEASES, "DAYZERO_MAX_BATCH": str(args.batch), **settings}
    with scratch() as tmp:
        with demo_stack(tmp, workers, settings, fp4=True) as stack:
            app = Celery(broker=stack.redis_url)
            rounds = [one_round(stack, app, args) for _ in range(args.rounds)]
        reruns = (stack.log_dir / "gateway.log").read_text(errors="replace").count("lost its worker; re-running")
    return rounds, reruns


def burst_summary(rounds: list[dict], reruns: int) -> None:
    slowest = statistics.median(got["first"][-1] for got in rounds)
    print(f"median of each round's slowest first token of the burst: {slowest:.2f} s")
    print(f"requests re-run by the reaper (a message taken, never claimed: 'lost its worker'): {reruns}")


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--chunk", type=int, default=64, help="DAYZERO_PREFILL_CHUNK_SIZE")
    args = ap.parse_args()
    workers = {"vision": 0, "prefill": 2, "decode": 1}
    rounds, reruns = run_rounds(args, workers, {"DAYZERO_PREFILL_CHUNK_SIZE": str(args.chunk)}, one_round)
    for n, got in enumerate(rounds):
        firsts, longs = (", ".join(f"{f:.2f}" for f in got[k]) for k in ("first", "long"))
        print(
            f"round {n}: first tokens: the burst's {firsts} s, the long prompts' {longs} s;"
            f" messages held unstarted (most at once): the busy prefill0 {got['unstarted']['prefill0']},"
            f" prefill1 {got['unstarted']['prefill1']}"
        )
    burst_summary(rounds, reruns)


if __name__ == "__main__":
    main()
