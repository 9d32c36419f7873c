"""What an outage longer than a lease costs a stream in flight: Redis refuses writes (``maxmemory`` 1,
no heartbeat lands) for ``--refused`` seconds while a 120-token stream decodes, on a stack of 1 prefill
and 1 decode worker on the demo checkpoint with leases of 1 s. Per outage: the re-runs the request
got (its attempt: each one a re-prefill, and decode dropping its copy), decode's "lease lost" lines,
whether the stream had every token once (against the same request unstreamed, before), and the
stream's seconds. Run back to back on two checkouts to compare.
Run: ``python bench/lapsed_lease.py [--outages 5] [--refused 3]``.
"""

from __future__ import annotations

import json
import threading
import time
from statistics import median

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.serving.keys import key

BODY = {"model": "dayzero-demo", "prompt": [0, 5, 4, 3, 2], "max_tokens": 120, "temperature": 0, "ignore_eos": True}


def streamed_through_an_outage(url: str, r: redis.Redis, refused_s: float) -> tuple[str, str]:
    """The stream's text and request id; writes refused for ``refused_s`` from its 10th token."""

    def refuse() -> None:
        r.config_set("maxmemory", 1)
        try:
            time.sleep(refused_s)
        finally:
            r.config_set("maxmemory", 0)

    text, fault = [], threading.Thread(target=refuse)
    with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=120) as response:
        rid = response.headers["x-request-id"]
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            text.append(json.loads(line[5:])["choices"][0]["text"])
            if len(text) == 10:
                fault.start()
    fault.join()
    return "".join(text), rid


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--outages", type=int, default=5)
    parser.add_argument("--refused", type=float, default=3.0, help="seconds of refused writes (leases: 1 s)")
    parser.add_argument("--keep", default="", help="a folder for the checkpoint and logs (default: temporary)")
    args = parser.parse_args()
    with scratch(args.keep) as folder, demo_stack(folder, {"prefill": 1, "decode": 1}, QUICK_LEASES) as stack:
        r, log = redis.Redis.from_url(stack.redis_url), stack.log_dir / "decode0.log"
        expected = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]
        print("| outage | re-runs (re-prefills) | decode 'lease lost' lines | every token once | stream s |")
        print("|---|---|---|---|---|")
        reruns, seconds = [], []
        for i in range(args.outages):
            lost_before, started = log.read_text().count("lease lost"), time.monotonic()
            text, rid = streamed_through_an_outage(stack.url, r, args.refused)
            seconds.append(time.monotonic() - started)
            reruns.append(int(r.get(key("attempt", rid)) or 0))
            lost = log.read_text().count("lease lost") - lost_before
            print(f"| {i + 1} | {reruns[-1]} | {lost} | {'yes' if text == expected else 'NO'} | {seconds[-1]:.1f} |")
        print(f"\nre-prefills per outage: {sum(reruns) / len(reruns):.2f}; median stream {median(seconds):.1f} s")


if __name__ == "__main__":
    main()
