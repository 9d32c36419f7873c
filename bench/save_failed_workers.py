"""Workers through a Redis whose save failed (``stop-writes-on-bgsave-error``: MISCONF to every write
and to PING, redis-py's health check of a broker connection idle past 25 s).

Starts a stack of 1 prefill and 1 decode worker on the demo checkpoint, makes Redis's save fail for
``--refused-s`` (longer than kombu's 25 s health-check interval), then lifts it. Reports, per worker,
whether it was still running when the refusal ended (not restarted), its "Unrecoverable error" and
"Connection to broker lost" lines, and then how long until ``/ready`` and a request served.
Run: ``python bench/save_failed_workers.py [--refused-s 40] [--keep DIR]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services.save_failed import save_failed  # noqa: E402

WORKERS = ("prefill0", "decode0")


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--refused-s", type=float, default=40.0)
    p.add_argument("--keep", default="", help="a folder to keep the stack's logs in")
    args = p.parse_args()
    workers = {"vision": 0, "prefill": 1, "decode": 1}
    with scratch(args.keep) as folder, demo_stack(folder, workers, QUICK_LEASES) as stack:
        r = redis.Redis.from_url(stack.redis_url)
        with save_failed(r):
            time.sleep(args.refused_s)
            running = {name: stack.child(name).proc.poll() is None for name in WORKERS}
        lifted = time.monotonic()
        stack.wait_ready(timeout_s=180)
        ready_s = time.monotonic() - lifted
        body = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 8}
        served = httpx.post(f"{stack.url}/v1/completions", json=body, timeout=120).status_code
        print(f"save failed {args.refused_s:.0f} s; /ready {ready_s:.1f} s after, a request then: {served}")
        for name in WORKERS:
            text = (folder / "logs" / f"{name}.log").read_text()
            print(
                f"{name}: running when lifted {running[name]}, restarts {stack.child(name).restarts}, "
                f"'Unrecoverable error' {text.count('Unrecoverable error')}, "
                f"'Connection to broker lost' {text.count('Connection to broker lost')}"
            )


if __name__ == "__main__":
    main()
