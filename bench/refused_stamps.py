"""What the workers' liveness stamps cost Redis while it refuses writes (out of memory, no eviction),
and how soon they are all in again after: ``--workers`` simulated workers (a liveness ``Pulse`` each,
in ``--processes`` processes), writes refused ``--refusal-s``. The refused stamps a second and Redis's
CPU (its INFO's used_cpu, the share of one core) over the refusal's last ``--window-s``, and the
time from Redis's return until every worker stamped again (median worker, last), for each retry
policy in turn: every ``STAMP_RETRY_S`` throughout (as before) and ``liveness.retry_after``. Real
Redis (embedded); medians of ``--rounds``.

    .venv/bin/python bench/refused_stamps.py [--workers 1000] [--processes 4] [--refusal-s 12] [--rounds 3]
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving import liveness
from dayzero.serving.keys import key

POLICIES = {"every 0.1 s (before)": math.inf, "retry_after (now)": liveness.QUICK_RETRIES_S}
STAGE = "prefill"


def stampers(url: str, first: int, count: int, quick_s: float, stop) -> None:
    """``count`` workers' pulses in this process, named ``first``..., until ``stop`` is set."""
    liveness.QUICK_RETRIES_S = quick_s
    liveness.stopped_child = lambda pid=None: False  # (a real worker has a few threads to look at, not 250)
    client = liveness.connect(url)
    pulses = []
    for i in range(first, first + count):
        pulse = liveness.Pulse(client, STAGE)
        pulse.process = f"worker:{i}"
        pulses.append(pulse.start())
    stop.wait()
    for pulse in pulses:
        pulse.stop()


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def counters(client: redis.Redis) -> tuple[float, int, int]:
    """Redis's CPU seconds so far, the scripts it has run (the stamps: EVALSHA), and all its commands."""
    cpu, calls = client.info("cpu"), client.info("commandstats")
    stamps, commands = calls.get("cmdstat_evalsha", {}).get("calls", 0), sum(c["calls"] for c in calls.values())
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], stamps, commands


def one_round(client: redis.Redis, url: str, args, quick_s: float) -> tuple[float, ...]:
    """-> refused stamps a second, commands a second (a worker backing off waits on a read), Redis's
    share of a core, seconds to the median and the last worker's stamp after the refusal."""
    context, stop = multiprocessing.get_context("spawn"), None
    stop = context.Event()
    share = math.ceil(args.workers / args.processes)
    procs = [
        context.Process(target=stampers, args=(url, first, min(share, args.workers - first), quick_s, stop))
        for first in range(0, args.workers, share)
    ]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + 60
        while client.hlen(key("alive", STAGE)) < args.workers and time.monotonic() < deadline:
            time.sleep(0.1)
        client.config_set("maxmemory", 1)
        try:
            time.sleep(args.refusal_s - args.window_s)
            before, wall = counters(client), time.monotonic()
            time.sleep(args.window_s)
            after, wall_s = counters(client), time.monotonic() - wall
        finally:  # (the time read before Redis takes writes: a stamp taken as they come back is after it)
            back = redis_now(client)
            client.config_set("maxmemory", 0)
        again = {}  # worker -> its first stamp after the refusal
        while len(again) < args.workers and time.monotonic() < deadline + 120:
            stamps = client.hgetall(key("alive", STAGE))
            again |= {p: float(t) for p, t in stamps.items() if float(t) > back and p not in again}
            time.sleep(0.01)
        since = sorted(t - back for t in again.values())
        cpu, stamps, commands = ((a - b) / wall_s for a, b in zip(after, before, strict=True))
        return stamps, commands, cpu, statistics.median(since), since[-1]
    finally:
        stop.set()
        for proc in procs:
            proc.join()
        client.delete(key("alive", STAGE), key("ready", STAGE))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--refusal-s", type=float, default=12.0)
    parser.add_argument("--window-s", type=float, default=5.0, help="measured over the refusal's last this")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_redis(Path(tmp)) as port:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        print(f"{args.workers} workers, writes refused {args.refusal_s:g} s (the last {args.window_s:g} s measured):")
        for policy, quick_s in POLICIES.items():
            rounds = [one_round(client, url, args, quick_s) for _ in range(args.rounds)]
            rate, commands, cpu, median, last = (statistics.median(column) for column in zip(*rounds, strict=True))
            print(
                f"{policy:>22}: {rate:6.0f} refused stamps/s ({commands:6.0f} commands/s), Redis {100 * cpu:4.1f} % "
                f"of a core; all stamped again {median:.2f} s (median worker) / {last:.2f} s (last) after"
            )


if __name__ == "__main__":
    main()
