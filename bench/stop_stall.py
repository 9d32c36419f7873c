"""What a decode worker's stop (SIGTERM: a rolling restart, a scale-down) costs a stream in flight: the
largest gap between two of its tokens, the client's stall. A stack of 1 prefill and 2 decode workers on
the demo checkpoint, default settings (lease 3 s, grace 5 s); a greedy 1,500-token stream whose decode
worker is SIGTERMed at its 20th token, the worker started again after each trial. Per trial: the
largest gap (s), the stop's seconds (SIGTERM to the process's end), whether the text equals the same
request's undisturbed (unstreamed, before), and who re-ran it ("worker": handed back by the stopping
worker; "reaper": a sweep after its lease lapsed). Medians at the end. Run back to back on two
checkouts (PYTHONPATH) to compare. Run: ``python bench/stop_stall.py [--trials 3]``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from statistics import median

import httpx
import redis
from demo_stack import demo_stack, scratch
from options import bench_parser

from dayzero.serving.keys import key

BODY = {"model": "dayzero-demo", "prompt": [0, 9, 8, 7, 6], "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
AT = 20  # the token at which its worker is stopped


def stopped_mid_stream(stack, r: redis.Redis) -> tuple[str, float, float, str, str]:
    """The stream's text, its largest gap between tokens (s), its worker's stop (s), that worker's name
    and the request's id."""
    text, arrivals, stop_s, name = [], [], [], ""

    def stop(child) -> None:  # (waited for beside the stream: the client reads on meanwhile)
        began = time.monotonic()
        os.killpg(child.proc.pid, signal.SIGTERM)
        child.proc.wait(30)
        stop_s.append(time.monotonic() - began)

    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**BODY, "stream": True}, timeout=300) as resp:
        rid = resp.headers["x-request-id"]
        for line in resp.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            arrivals.append(time.monotonic())
            text.append(json.loads(line[5:])["choices"][0]["text"])
            if len(text) == AT:
                name = r.get(key("lease", rid)).decode().split("@")[0]
                stopping = threading.Thread(target=stop, args=(stack.child(name),))
                stopping.start()
    if len(text) < AT:  # (ended by its stop string or the model's end: nothing was stopped)
        raise SystemExit(f"the stream ended after {len(text)} tokens, before the stop at token {AT}")
    stopping.join()
    gap = max(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return "".join(text), gap, stop_s[0], name, rid


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    with scratch() as folder, demo_stack(folder, {"vision": 0, "prefill": 1, "decode": 2}) as stack:
        r = redis.Redis.from_url(stack.redis_url)
        expected = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=300).json()["choices"][0]["text"]
        gaps, stops = [], []
        print("| trial | largest gap (s) | stop (s) | text equal | re-run by |")
        print("|---|---|---|---|---|")
        for trial in range(args.trials):
            text, gap, stop_s, name, rid = stopped_mid_stream(stack, r)
            worker_log = (stack.log_dir / f"{name}.log").read_text()
            by = "worker" if f"request {rid} was handed back by its stopping worker" in worker_log else "reaper"
            gaps.append(gap)
            stops.append(stop_s)
            print(f"| {trial + 1} | {gap:.2f} | {stop_s:.2f} | {text == expected} | {by} |")
            stack.until_ready(name, 120)  # started again for the next trial
        print(f"| median | {median(gaps):.2f} | {median(stops):.2f} | | |")


if __name__ == "__main__":
    main()
