"""What one hop between processes costs on this machine when they were idle, against back to back.

Every hop of a request through the stack (client -> gateway -> Redis -> prefill worker -> Redis
-> gateway -> client) wakes a process that was blocked, and on a VM a blocked process's vCPU may
have halted: waking it can cost more than the work of the hop. This times the simplest hop, a
Redis round trip from this process (PING, and an XADD to a stream another process blocks on in
XREAD, as the gateway does on a token stream), back to back and with an idle pause before each,
against an embedded redis-server; and, for scale, the same pause before a piece of pure Python
work in this process (no other process involved: how much slower code runs just after idling).
Medians. Run: ``python bench/wakeups.py [--samples 200]
[--pause-ms 10]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import redis
from options import bench_parser

from dayzero.procs import scratch_redis

READER = """
import sys, redis
r, last = redis.Redis(port=int(sys.argv[1])), "$"
while True:
    reply = r.xread({"tokens": last}, block=10000)
    if reply:
        last = reply[0][1][-1][0]
"""


def python_work(_: int) -> None:
    for _ in range(20):
        json.loads(json.dumps({"a": list(range(50)), "b": "x" * 100}))


def median_ms(call, samples: int, pause_s: float) -> float:
    times = []
    for i in range(samples):
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def row(name: str, call, args) -> None:
    hot, idle = (median_ms(call, args.samples, pause) for pause in (0, args.pause_ms / 1e3))
    print(f"| {name} | {hot:.3f} | {idle:.3f} | {idle / hot:.1f}x |")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--pause-ms", type=float, default=10.0, help="idle time before each timed round trip")
    args = parser.parse_args()
    print(f"| round trip, median of {args.samples} | back to back ms | after {args.pause_ms:g} ms idle | ratio |")
    print("|---|---:|---:|---:|")
    with scratch_redis() as port:
        r = redis.Redis(port=port)
        reader = subprocess.Popen([sys.executable, "-c", READER, str(port)])
        try:
            row("none: 20 JSON round trips in this process", python_work, args)
            row("PING", lambda i: r.ping(), args)
            row("XADD, another process blocked on the stream in XREAD", lambda i: r.xadd("tokens", {"i": i}), args)
        finally:
            reader.kill()
            reader.wait()


if __name__ == "__main__":
    main()
