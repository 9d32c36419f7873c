"""Microseconds per call of the reaper pass's script calls that take a client (``no_worker_count.unserved_for``
and ``count_again``, ``watching.cancel_left``; a stage without a worker, no cancel due), and of
``register_script`` alone (what each call paid before ``client_scripts.registered``). Real Redis
(embedded), one client; the medians of ``--rounds`` rounds of ``--calls`` calls each, wall and CPU.

    .venv/bin/python bench/reaper_scripts.py [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key
from dayzero.serving.no_worker_count import COUNT, count_again, unserved_for
from dayzero.serving.watching import cancel_left


def per_call_us(call: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """The medians over ``rounds`` of the mean wall time and this process's CPU time (the caller's
    own work, without the wait for Redis: steadier on a shared machine) of ``calls`` calls, in us."""
    call()  # (scripts loaded)
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        walls.append((time.perf_counter() - wall) / calls * 1e6)
        cpus.append((time.process_time() - cpu) / calls * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with scratch_redis() as port:
        client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
        client.zadd(key("left"), {"later": time.time() + 3600})  # (a cancel left, not due: a pass's usual case)
        calls = {
            "register_script (alone)": lambda: client.register_script(COUNT),
            "unserved_for": lambda: unserved_for(client, "decode"),
            "count_again": lambda: count_again(client, ("vision", "prefill", "decode"), 0.0),
            "cancel_left": lambda: cancel_left(client, 600),
        }
        for name, call in calls.items():
            wall, cpu = per_call_us(call, args.calls, args.rounds)
            print(f"{name:>24}: {wall:8.1f} us a call, {cpu:6.1f} us of this process's CPU")


if __name__ == "__main__":
    main()
