"""Seconds a gateway takes to exit after its SIGTERM while its Redis is frozen (SIGSTOP) and a reaper
pass hangs on it: ``dayzero up``'s Stack, the gateway alone, its own Redis, leases of 2 s (a pass a
second). The stop waits for the reaper's stamp in flight before its leave of the gateways (at most
REAPER_END_S); the streams' close need not wait too (it did: 11.3 -> 15.4 s).

    .venv/bin/python bench/gateway_stop_frozen_redis.py --stops 3
"""

from __future__ import annotations

import signal
import statistics
import time

from demo_stack import scratch
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port
from dayzero.stack import Stack

NONE = {"vision": 0, "prefill": 0, "decode": 0}


def one_stop(checkpoint, logs) -> float:
    env = {"DAYZERO_CHECKPOINT": str(checkpoint), "DAYZERO_LEASE_S": "2", "OMP_NUM_THREADS": "1"}
    stack = Stack(NONE, free_port(), logs, env)
    stack.start()
    try:
        stack.until_ready("gateway", 120)
        time.sleep(1.0)
        stack.redis.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # a reaper pass (every lease / 2) begins and hangs on the frozen Redis
        gateway = stack.child("gateway").proc
        began = time.monotonic()
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(60)
        return time.monotonic() - began
    finally:
        stack.redis.send_signal(signal.SIGCONT)
        stack.stop()


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--stops", type=int, default=3)
    args = ap.parse_args()
    with scratch() as work:
        checkpoint = write_demo_checkpoint(work / "demo", fp4=True)
        took = [one_stop(checkpoint, work / f"logs{i}") for i in range(args.stops)]
    print("| stops | exit after SIGTERM: median | min | max |\n|---:|---:|---:|---:|")
    print(f"| {len(took)} | {statistics.median(took):.2f} s | {min(took):.2f} s | {max(took):.2f} s |")


if __name__ == "__main__":
    main()
