"""Recovery benchmark: SIGKILL the prefill and the decode worker together under streaming load.

Starts a stack of ``--prefill`` prefill workers and 1 decode worker on the demo checkpoint,
supervised as ``dayzero up`` supervises it, runs closed-loop streaming clients (``--requests``
each; every third request leaves after three chunks), and kills the workers named in ``--kill``
(prefill0 and decode0) once a share of the requests (``--kill-at``) has ended, so that the load
is in flight whatever the machine's speed. The supervisor
restarts them; the reaper re-runs what they held. Reports, for the requests in
flight at the kill, how long after it each one ended (p50 / p90 / max), the requests (any) still
unfinished ``--wait`` seconds after the kill, and what Redis still holds for unfinished requests.
The stack's settings come from the environment (``DAYZERO_KV_BUDGET_MB=8``: small pools). Run:
``python bench/recovery.py [--clients 48] [--requests 3] [--kill-at 0.25] [--wait 120] [--prefill 1]
[--kill prefill0,decode0]``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import threading
import time

import httpx
import redis
from demo_stack import demo_stack, scratch
from options import bench_parser
from serve import pct

MODEL = "dayzero-demo"


async def one(client: httpx.AsyncClient, url: str, prompt: list[int], leave: bool, runs: list) -> None:
    """One streamed request: [start, end, outcome (done, left, cut, HTTP status)] in ``runs``, the
    end None while it runs."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 48, "stream": True, "ignore_eos": True}
    run, chunks, outcome = [time.time(), None, "cut"], 0, "cut"
    runs.append(run)
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            outcome = f"HTTP {r.status_code}"
        else:
            async for line in r.aiter_lines():
                chunks += line.startswith("data: {")
                if leave and chunks == 3:
                    outcome = "left"
                    break
                if line == "data: [DONE]":
                    outcome = "done"
    run[1:] = [time.time(), outcome]


async def clients(url: str, n: int, per: int, runs: list) -> None:
    async with httpx.AsyncClient(timeout=None) as client:

        async def closed_loop(i: int) -> None:
            for k in range(per):
                prompt = [0] + [(i * 31 + k * 7 + j) % 498 + 2 for j in range(100)]
                await one(client, url, prompt, (i + k) % 3 == 0, runs)

        await asyncio.gather(*(closed_loop(i) for i in range(n)))


async def until_after(load, killed: list, wait_s: float) -> None:
    """Run ``load`` until it ends, or until ``wait_s`` after the kill."""
    task = asyncio.ensure_future(load)
    while not killed and not task.done():
        await asyncio.sleep(0.05)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(task, wait_s)


def leftovers(r: redis.Redis) -> list[str]:
    """Each unfinished request's lease, queued mark and stream length."""
    rows = []
    for rid in sorted(m.decode() for m in r.smembers("dz:active")):
        lease, queued, left = r.get(f"dz:lease:{rid}"), r.get(f"dz:queued:{rid}"), r.pttl(f"dz:queued:{rid}")
        tokens = r.xlen(f"dz:tokens:{rid}")
        rows.append(f"{rid[:12]} lease={lease} queued={queued} ({left / 1000:.0f} s left) tokens={tokens}")
    return rows


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--requests", type=int, default=3, help="requests per client, one after another")
    ap.add_argument("--kill-at", type=float, default=0.25, help="the share of the requests ended before the kill")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for every request after the kill")
    ap.add_argument("--prefill", type=int, default=1, help="prefill workers")
    ap.add_argument("--kill", default="prefill0,decode0", help="the workers SIGKILLed together, comma-separated")
    args = ap.parse_args()
    runs, killed, restarted, done = [], [], [], threading.Event()
    workers = {"vision": 0, "prefill": args.prefill, "decode": 1}
    with scratch() as tmp, demo_stack(tmp, workers, {"OMP_NUM_THREADS": "1"}) as stack:

        def kill_then_supervise() -> None:
            while sum(run[1] is not None for run in runs) < args.kill_at * args.clients * args.requests:
                time.sleep(0.01)
            killed.append(time.time())
            for name in args.kill.split(","):
                os.killpg(stack.child(name).proc.pid, signal.SIGKILL)
            # up's loop, to the end, as up runs it (a thread that ended once they ran ready took the workers
            # it restarted with it before procs.Spawner: PR_SET_PDEATHSIG, requests ended 60 s on: 503 no_worker)
            stack.supervised_until(done.is_set, None, lambda name: restarted.append(name))

        supervisor = threading.Thread(target=kill_then_supervise, daemon=True)
        supervisor.start()
        try:
            asyncio.run(until_after(clients(stack.url, args.clients, args.requests, runs), killed, args.wait))
            time.sleep(1)
            stuck = leftovers(redis.Redis.from_url(stack.redis_url))
        finally:
            done.set()  # no restarts while the stack stops
            supervisor.join(10)
    at = killed[0]
    in_flight = [(start, end) for start, end, _ in runs if start < at and (end is None or end > at)]
    after = [end - at for _, end in in_flight if end is not None]
    outcomes = collections.Counter(outcome for _, end, outcome in runs if end is not None)
    print(f"| clients | in flight at the kill | ended after: p50 | p90 | max | unfinished after {args.wait:.0f} s |")
    print("|---:|---:|---:|---:|---:|---:|")
    cells = " | ".join(f"{pct(after, q):.1f} s" for q in (0.5, 0.9, 1.0))
    print(f"| {args.clients} | {len(in_flight)} | {cells} | {sum(end is None for _, end, _ in runs)} |")
    print("outcomes:", dict(outcomes), "restarted:", ", ".join(restarted))
    for row in stuck:
        print("left in Redis:", row)


if __name__ == "__main__":
    main()
