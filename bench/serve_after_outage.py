"""How soon a stack serves again once Redis is back from an outage: Redis killed for each of ``--outages``
seconds, then started again on its port (empty); from then, requests sent one after another (each
waits for its answer) until one is answered 200, and each worker's Celery "Connected to" line (its
consumer's reconnect) read from its log. A stack of 1 prefill and 1 decode worker on the demo
checkpoint (leases of 1 s), one outage after another on it.
Run: ``python bench/serve_after_outage.py [--outages 5,15,40] [--rounds 1]``.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import httpx
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.stack import Stack

BODY = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 4}
CONNECTED = ": INFO/MainProcess] Connected to "  # Celery's line once its consumer has reconnected
SERVED_WITHIN_S = 120.0  # an outage's requests are given up after this long


def connected_at(log: Path, after: int) -> float | None:
    """The host time (epoch s) of the first "Connected to" line in ``log`` past its first ``after`` chars."""
    for line in log.read_text()[after:].splitlines():
        if CONNECTED in line:
            return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def served_after(stack: Stack, outage_s: float, logs: dict[str, Path]) -> tuple[float, int, dict[str, float | None]]:
    """One outage: seconds from Redis back to the first 200, the answers before it, each worker's
    seconds from Redis back to its "Connected to"."""
    marks = {name: len(log.read_text()) for name, log in logs.items()}
    stack.redis.kill()
    stack.redis.wait()
    time.sleep(outage_s)
    assert stack.supervise() == ["redis"]
    back, back_wall = time.monotonic(), time.time()
    failed = 0
    while time.monotonic() - back < SERVED_WITHIN_S:
        try:
            if httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=SERVED_WITHIN_S).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        failed += 1
        time.sleep(0.1)
    served = time.monotonic() - back
    time.sleep(1.0)  # (the log lines written)
    connects = {name: connected_at(log, marks[name]) for name, log in logs.items()}
    return served, failed, {name: None if at is None else at - back_wall for name, at in connects.items()}


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--outages", default="5,15,40", help="seconds Redis is out, comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--keep", default="", help="a folder to keep the stack's logs in")
    args = p.parse_args()
    outages = [float(s) for s in args.outages.split(",")]
    workers = {"vision": 0, "prefill": 1, "decode": 1}
    with scratch(args.keep) as folder, demo_stack(folder, workers, QUICK_LEASES) as stack:
        logs = {name: folder / "logs" / f"{name}.log" for name in ("prefill0", "decode0")}
        heads = ("outage s", "served after s", "answers before", "prefill connected s", "decode connected s")
        print(" ".join(f"{head:>{len(head)}}" for head in heads))
        for _ in range(args.rounds):
            for outage_s in outages:
                served, failed, connects = served_after(stack, outage_s, logs)
                said = [f"{s:.1f}" if s is not None else "-" for s in connects.values()]
                print(f"{outage_s:8.0f} {served:14.1f} {failed:14d} {said[0]:>19} {said[1]:>18}", flush=True)


if __name__ == "__main__":
    main()
