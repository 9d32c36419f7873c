"""Prefill's hand-back on a real stack: how often a handed-back prompt bounces.

2 prefill workers and 1 decode worker on the demo checkpoint, 1 MB pools, decode frozen (it never
takes the long prompt's handoff, whose blocks stay in its prefill worker). A long prompt fills one
prefill worker; then 4 short prompts follow, each landing on either worker (Celery's queue read):
those on the full one wait there and go back to prefill's queue for the other. Per trial: the
hand-backs, the self-retakes (a worker handing back a prompt it handed back before: it took its own
hand-back again), and each short prompt's time to first token. The hand-back log lines (INFO, one
per hand back) are the record. Run: ``python bench/handback.py [--trials 3]``.
"""

from __future__ import annotations

import collections
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import redis
from demo_stack import running, scratch, stack_on
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.serving.keys import key

ENV = {
    "DAYZERO_LEASE_S": "1.0",
    "DAYZERO_MAX_BATCH": "32",
    "DAYZERO_KV_BUDGET_MB": "1",
    "DAYZERO_MAX_CONTEXT": "4096",
    "DAYZERO_MAX_TOKENS_LIMIT": "3000",
    "DAYZERO_HANDOFF_TIMEOUT_S": "20",
}
LONG = [(7 * k) % 500 + 2 for k in range(3400)]
HANDED = re.compile(r"request (\S+): handed back to the prefill queue")


def ttft(url: str, r: redis.Redis, prompt: list[int], out: dict, name: str) -> None:
    """Time to the first token in the request's stream (its text may wait for the next token in SSE)."""
    body = {"model": "dayzero-demo", "prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}
    start = time.time()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        rid = response.headers["x-request-id"]
        out[name] = [rid, None]
        while time.time() < start + 60 and not r.xlen(key("tokens", rid)):
            time.sleep(0.01)
        out[name][1] = time.time() - start


def hand_backs(log_dir: Path) -> list[tuple[str, str]]:
    """(request id, worker) per hand back, in log order per worker, merged by the log's time stamp."""
    rows = []
    for worker in ("prefill0", "prefill1"):
        for line in (log_dir / f"{worker}.log").read_text().splitlines():
            if m := HANDED.search(line):
                rows.append((line[:23], m.group(1), worker))
    return [(rid, worker) for _, rid, worker in sorted(rows)]


def trial(ckpt: Path, log_dir: Path) -> dict:
    with running(stack_on(ckpt, {"vision": 0, "prefill": 2, "decode": 1}, log_dir, ENV), ready_s=240) as stack:
        r, out, threads = redis.Redis.from_url(stack.redis_url), {}, []
        decode = stack.child("decode0").proc
        decode.send_signal(signal.SIGSTOP)
        threads.append(threading.Thread(target=ttft, args=(stack.url, r, LONG, out, "long")))
        threads[-1].start()
        deadline = time.time() + 60
        while time.time() < deadline and not ("long" in out and r.xlen(key("tokens", out["long"][0]))):
            time.sleep(0.05)
        for i in range(4):
            prompt = [0, *[(7 * i + 3 * k) % 500 + 2 for k in range(5 + 3 * i)]]
            threads.append(threading.Thread(target=ttft, args=(stack.url, r, prompt, out, f"short{i}")))
            threads[-1].start()
        for thread in threads[1:]:
            thread.join(60)
        time.sleep(0.5)
        rows = hand_backs(log_dir)
        decode.send_signal(signal.SIGCONT)
        threads[0].join(60)
    per: dict[str, list[str]] = collections.defaultdict(list)
    for rid, worker in rows:
        per[rid].append(worker)
    retakes = sum(a == b for seq in per.values() for a, b in zip(seq, seq[1:], strict=False))
    return {
        "hand_backs": len(rows),
        "self_retakes": retakes,
        "most_for_one": max((len(s) for s in per.values()), default=0),
        "ttft_s": sorted(round(v[1], 2) for k, v in out.items() if k != "long" and v[1] is not None),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--keep", default="", help="a folder for the stacks' logs (else a temporary one)")
    args = parser.parse_args()
    with scratch(args.keep) as tmp:
        ckpt = write_demo_checkpoint(tmp / "ckpt", fp4=True)
        for i in range(args.trials):
            print(trial(ckpt, tmp / f"logs{i}"), flush=True)


if __name__ == "__main__":
    main()
