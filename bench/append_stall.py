"""Redis failing under a stream: how long the stream stalls, and whether decode re-ran the request.

Starts a stack of 1 prefill and 1 decode worker on the demo checkpoint (lease ``--lease`` s, long
enough that no lease lapses during the fault), takes an undisturbed greedy run's text, then per
trial streams the same request and, once ``--after`` tokens have come, applies the fault for
``--fault-s`` seconds: ``stop`` SIGSTOPs the embedded redis-server (SIGCONT after; a worker's
command times out after 5 s, and one sent before the stop runs late, when Redis continues);
``refuse`` makes Redis refuse writes (``maxmemory`` 1: every script that writes is refused with
OOM, reads still answer; restored after). Reports per trial: the stall (the time from the fault's
end to the next token the client reads), the longest gap between two tokens, whether the text
equals the undisturbed one, the request's attempts (1: never re-run) and the decode worker's
"lease lost" drops. ``--at prefill`` instead sends a long prompt and applies the fault as soon as
the prefill worker holds it, across its first token's append: reports the time to the first token
against the undisturbed one's, the prefill worker's Redis errors (each a retry) and the prompt
tokens it prefilled per faulted request (the prompt's once: no retry prefilled it again).
Run: ``python bench/append_stall.py [--fault stop|refuse] [--at decode|prefill] [--trials 3]
[--fault-s 7] [--after 20] [--lease 20]``.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import redis

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port
from dayzero.stack import Stack

MODEL = "dayzero-demo"
BODY = {"model": MODEL, "prompt": [0, 5, 4, 3, 2], "max_tokens": 300, "temperature": 0, "ignore_eos": True}
LONG = {**BODY, "prompt": [0] + [(k * 13) % 500 + 2 for k in range(3000)], "max_tokens": 4}


def fault(stack: Stack, kind: str, seconds: float) -> float:
    """Apply the fault for ``seconds``; -> when it ended (time.time())."""
    control = redis.Redis.from_url(stack.redis_url)
    if kind == "stop":
        stack.redis.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        stack.redis.send_signal(signal.SIGCONT)
    else:
        control.config_set("maxmemory", 1)
        time.sleep(seconds)
        control.config_set("maxmemory", 0)
    return time.time()


def trial(stack: Stack, kind: str, seconds: float, after: int) -> dict:
    """One streamed request with the fault once ``after`` tokens came."""
    arrivals, text, ended, rid = [], [], [], None
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**BODY, "stream": True}, timeout=120) as r:
        rid = r.headers["x-request-id"]
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            arrivals.append(time.time())
            text.append(httpx.Response(200, content=line[6:]).json()["choices"][0]["text"])
            if len(arrivals) == after:
                thread = threading.Thread(target=lambda: ended.append(fault(stack, kind, seconds)))
                thread.start()
    thread.join()
    attempt = redis.Redis.from_url(stack.redis_url).get(f"dz:attempt:{rid}")
    stall = min((t for t in arrivals if t > ended[0]), default=float("nan")) - ended[0]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {"text": "".join(text), "stall": stall, "gap": max(gaps), "attempt": int(attempt or 0)}


def prefill_trial(stack: Stack, kind: str, seconds: float) -> tuple[float, float]:
    """The long prompt with the fault from when prefill holds it. -> its time to first token, and from
    the fault's end to it (nan: no fault)."""
    control, ended = redis.Redis.from_url(stack.redis_url), []
    start = time.time()
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**LONG, "stream": True}, timeout=120) as r:
        lease = f"dz:lease:{r.headers['x-request-id']}"
        while not (control.get(lease) or b"").startswith(b"prefill"):
            time.sleep(0.005)
        thread = threading.Thread(target=lambda: seconds and ended.append(fault(stack, kind, seconds)))
        thread.start()
        first = next(time.time() for line in r.iter_lines() if line.startswith("data: {"))
    thread.join()
    return first - start, first - ended[0] if ended else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=("stop", "refuse"), default="stop")
    parser.add_argument("--at", choices=("decode", "prefill"), default="decode")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--fault-s", type=float, default=7.0)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--lease", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "DAYZERO_CHECKPOINT": str(write_demo_checkpoint(Path(tmp) / "demo", fp4=True)),
            "DAYZERO_LEASE_S": str(args.lease),
            "DAYZERO_KEEPALIVE_S": "1.0",
            "OMP_NUM_THREADS": "1",
        }
        stack = Stack({"vision": 0, "prefill": 1, "decode": 1}, free_port(), Path(tmp) / "logs", env)
        stack.start()
        try:
            stack.wait_ready(timeout_s=300)
            if args.at == "prefill":
                prefill(stack, args)
                return
            expected = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]
            rows = [trial(stack, args.fault, args.fault_s, args.after) for _ in range(args.trials)]
            drops = (Path(tmp) / "logs" / "decode0.log").read_text().count("lease lost; dropping")
        finally:
            stack.stop()
    print(f"fault: {args.fault} {args.fault_s:g} s after {args.after} tokens, lease {args.lease:g} s")
    print("| trial | stall after the fault | longest gap | same text | attempts |")
    print("|---:|---:|---:|---|---:|")
    for i, row in enumerate(rows):
        same = row["text"] == expected
        print(f"| {i} | {row['stall']:.2f} s | {row['gap']:.2f} s | {same} | {row['attempt']} |")
    print("decode's 'lease lost' drops:", drops)


def prefilled_tokens(stack: Stack, lease_s: float) -> float:
    """The prompt tokens the prefill worker has run through the model, from its latest metrics snapshot
    (taken a quarter lease apart at most: waited for)."""
    time.sleep(lease_s / 4 + 1)
    lines = httpx.get(f"{stack.url}/metrics", timeout=30).text.splitlines()
    series = [line for line in lines if line.startswith("dayzero_tokens_total{") and 'stage="prefill"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in series)


def prefill(stack: Stack, args: argparse.Namespace) -> None:
    undisturbed = [prefill_trial(stack, args.fault, 0) for _ in range(args.trials)]
    before = prefilled_tokens(stack, args.lease)
    faulted = [prefill_trial(stack, args.fault, args.fault_s) for _ in range(args.trials)]
    per_request = (prefilled_tokens(stack, args.lease) - before) / args.trials
    errors = (stack.log_dir / "prefill0.log").read_text().count("redis unavailable")
    print(f"fault: {args.fault} {args.fault_s:g} s from when prefill holds a {len(LONG['prompt'])}-token prompt")
    print("time to first token, undisturbed:", " ".join(f"{t:.2f} s" for t, _ in undisturbed))
    print("time to first token, with the fault:", " ".join(f"{t:.2f} s" for t, _ in faulted))
    print("  of which after the fault's end:", " ".join(f"{t:.2f} s" for _, t in faulted))
    print("prefill's 'redis unavailable' (each: a retry of the batch's sends):", errors)
    print(f"prompt tokens prefilled per faulted request: {per_request:.0f}")


if __name__ == "__main__":
    main()
