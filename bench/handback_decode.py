"""Decode's hand-back on a real stack: how often a handed-back request bounces between two busy workers.

1 prefill worker and 2 decode workers on the demo checkpoint, 1 MB pools (a decode worker holds 55
CSA blocks of 64 tokens), many concurrent streams of mixed lengths (every fourth 1200 completion
tokens, the others 100-400): both decode workers fill, requests wait, and each end frees room that
the other worker's waiting requests are handed back for (a long one handed back pauses its worker's
intake till its blocks could hold it). Per wave of streams: the hand-backs (the INFO log line, one per hand back), the
bounces (a request's second and later hand-backs: handed back, taken, and handed back again), the
requests bounced, the most for one request, the seconds from a request's first hand-back to its last
(summed: the time lost bouncing), the wave's wall time and every stream's end (each must end with
finish reason "length"). Waves run on one stack, one after another. Run:
``python bench/handback_decode.py [--waves 3] [--streams 32]``.
"""

from __future__ import annotations

import collections
import datetime
import json
import random
import re
import statistics
import threading
import time
from pathlib import Path

import httpx
import redis
from demo_stack import demo_stack, scratch
from options import bench_parser

from dayzero.serving.registry import Registry

ENV = {
    "DAYZERO_LEASE_S": "1.0",
    "DAYZERO_MAX_BATCH": "32",
    "DAYZERO_KV_BUDGET_MB": "1",
    "DAYZERO_MAX_CONTEXT": "3000",
    "DAYZERO_MAX_TOKENS_LIMIT": "3000",
    "DAYZERO_HANDOFF_TIMEOUT_S": "120",
    "DAYZERO_TASK_TIME_LIMIT_S": "600",
}
WORKERS = ("decode0", "decode1")
LONG = 1200  # completion tokens of every fourth stream: 19 CSA blocks (the others: 2-7)
HANDED = re.compile(r"request (\S+): handed back to the decode queue")


def stream(url: str, prompt: list[int], max_tokens: int, out: dict, name: str) -> None:
    """One streamed completion: its request id and its finish reason ("length": every token came)."""
    body = {"model": "dayzero-demo", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    out[name] = {"rid": "", "finish": None}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        out[name]["rid"] = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                out[name]["finish"] = choice.get("finish_reason") or out[name]["finish"]


def hand_backs(log_dir: Path) -> list[tuple[float, str, str]]:
    """(time, request id, worker) per decode hand back, in time order."""
    rows = []
    for worker in WORKERS:
        for line in (log_dir / f"{worker}.log").read_text().splitlines():
            if m := HANDED.search(line):
                at = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                rows.append((at, m.group(1), worker))
    return sorted(rows)


def wave(url: str, log_dir: Path, streams: int, seed: int) -> dict:
    rng, out, threads = random.Random(seed), {}, []
    start = time.time()
    for i in range(streams):
        prompt = [0, *[rng.randrange(2, 500) for _ in range(rng.randrange(3, 12))]]
        args = (url, prompt, LONG if i % 4 == 0 else rng.randrange(100, 400), out, f"s{i}")
        threads.append(threading.Thread(target=stream, args=args))
        threads[-1].start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(600)
    wall = time.time() - start
    mine = {v["rid"] for v in out.values()}
    per: dict[str, list[float]] = collections.defaultdict(list)
    for at, rid, _ in hand_backs(log_dir):
        if rid in mine:
            per[rid].append(at)
    bounced = [times for times in per.values() if len(times) > 1]
    return {
        "hand_backs": sum(len(t) for t in per.values()),
        "bounces": sum(len(t) - 1 for t in bounced),
        "requests_bounced": len(bounced),
        "most_for_one": max((len(t) for t in per.values()), default=0),
        "bouncing_s": round(sum(t[-1] - t[0] for t in bounced), 2),
        "wall_s": round(wall, 1),
        "not_length": sum(v["finish"] != "length" for v in out.values()),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--keep", default="", help="a folder for the stack's logs (else a temporary one)")
    args = parser.parse_args()
    workers = {"vision": 0, "prefill": 1, "decode": 2}
    with scratch(args.keep) as tmp, demo_stack(tmp, workers, ENV, fp4=True, ready_s=240) as stack:
        registry, deadline = Registry(redis.Redis.from_url(stack.redis_url)), time.time() + 120
        while len(registry.live_workers("decode", 3)) < len(WORKERS) and time.time() < deadline:
            time.sleep(0.2)  # /ready needs only one
        rows = []
        for seed in range(args.waves):
            rows.append(wave(stack.url, tmp / "logs", args.streams, seed))
            print(rows[-1], flush=True)
    for name in ("hand_backs", "bounces", "bouncing_s", "wall_s"):
        print(f"median {name}: {statistics.median(r[name] for r in rows)}")


if __name__ == "__main__":
    main()
