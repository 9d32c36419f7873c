"""How long a request whose client left while its handoff waited on decode's queue stays unended.

A stack of 1 prefill and 1 decode worker on the demo checkpoint (leases of 1 s, a disconnect grace of
0.3 s, handoff through Redis with DAYZERO_HANDOFF_TIMEOUT_S ``--timeout`` s). Once it is ready its
decode worker stops (as while it restarts, or with every thread busy: nobody takes decode's messages;
DAYZERO_NO_WORKER_TIMEOUT_S 600 keeps the stage served meanwhile). Per round a stream leaves once
prefill has handed it off (its first token streamed), while its handoff waits on decode's queue.
Reports per round the seconds from its leave to its end (``done``) and the bytes of its state waiting
in Redis till then (kvstate, dropped at its end). Run back to back on two checkouts to compare.
Run: ``python bench/cancelled_handoff.py [--rounds 3] [--timeout 20]``.
"""

from __future__ import annotations

import time
from statistics import median

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.serving.keys import key

BODY = {"model": "dayzero-demo", "prompt": [0, 5, 4, 3, 2], "max_tokens": 50, "stream": True}


def wait_for(what, timeout_s: float) -> float:
    """Seconds until ``what()`` is true (polled every 10 ms); raises past ``timeout_s``."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError("waited too long")
        time.sleep(0.01)
    return time.monotonic() - start


def cut_round(url: str, r: redis.Redis, timeout_s: float) -> tuple[float, int]:
    """-> (seconds from the leave to the request's end, its state's bytes in Redis at the leave)."""
    with httpx.stream("POST", f"{url}/v1/completions", json=BODY, timeout=120) as response:
        rid = response.headers["x-request-id"]
        wait_for(lambda: r.get(key("lease", rid)) == b"handoff", 60)  # waiting on decode's queue
        held = r.strlen(key("kvstate", rid))
    return wait_for(lambda: r.exists(key("done", rid)), timeout_s + 30), held


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=20.0, help="DAYZERO_HANDOFF_TIMEOUT_S")
    parser.add_argument("--keep", default="", help="a folder for the checkpoint and logs (default: temporary)")
    args = parser.parse_args()
    settings = {
        **QUICK_LEASES,
        "DAYZERO_HANDOFF": "redis",
        "DAYZERO_HANDOFF_TIMEOUT_S": str(args.timeout),
        "DAYZERO_DISCONNECT_GRACE_S": "0.3",
        "DAYZERO_NO_WORKER_TIMEOUT_S": "600",
    }
    with scratch(args.keep) as folder, demo_stack(folder, {"prefill": 1, "decode": 1}, settings) as stack:
        decode = stack.child("decode0").proc
        decode.terminate()
        decode.wait(60)
        r = redis.Redis.from_url(stack.redis_url)
        rows = [cut_round(stack.url, r, args.timeout) for _ in range(args.rounds)]
    print(f"DAYZERO_HANDOFF_TIMEOUT_S {args.timeout:g} s, leases 1 s, disconnect grace 0.3 s; no decode worker")
    print("| round | leave -> end s | kvstate bytes held |")
    print("|---|---:|---:|")
    for i, (ended, held) in enumerate(rows, 1):
        print(f"| {i} | {ended:.2f} | {held} |")
    print(f"| median | {median(ended for ended, _ in rows):.2f} | |")


if __name__ == "__main__":
    main()
