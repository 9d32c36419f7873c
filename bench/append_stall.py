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
tokens it prefilled per faulted request (the prompt's once: no retry prefilled it again). With
``--beside``, per trial a short prompt joins the long one under way (sent once prefill holds the
long one, the fault once it holds both): the short one's first append is refused while the long one
still has chunks to prefill (``--chunk``: DAYZERO_PREFILL_CHUNK_SIZE); reports each one's first token
after the fault's end (the long one's: whether the loop went on prefilling it meanwhile).
Run: ``python bench/append_stall.py [--fault stop|refuse] [--at decode|prefill] [--beside] [--chunk N]
[--trials 3] [--fault-s 7] [--after 20] [--lease 20]``.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

import httpx
import redis
from demo_stack import demo_stack, scratch
from options import bench_parser

from dayzero.stack import Stack

MODEL = "dayzero-demo"
BODY = {"model": MODEL, "prompt": [0, 5, 4, 3, 2], "max_tokens": 300, "temperature": 0, "ignore_eos": True}
LONG = {**BODY, "prompt": [0] + [(k * 13) % 500 + 2 for k in range(3000)], "max_tokens": 4}
SHORT = {**BODY, "max_tokens": 4}


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


def held_by_prefill(control: redis.Redis, found: dict) -> None:
    """Wait till the streamed request of ``found`` (its id once its response began) is prefill's."""
    while "rid" not in found or not (control.get(f"dz:lease:{found['rid']}") or b"").startswith(b"prefill"):
        time.sleep(0.005)


def first_token(stack: Stack, body: dict, found: dict) -> None:
    """Stream ``body``: its request id, then when its first token came (time.time()), into ``found``."""
    with httpx.stream("POST", f"{stack.url}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        found["rid"] = r.headers["x-request-id"]
        lines = r.iter_lines()
        found["first"] = next(time.time() for line in lines if line.startswith("data: {"))
        for _ in lines:  # (to its end)
            pass


def beside_trial(stack: Stack, kind: str, seconds: float) -> tuple[float, float]:
    """The long prompt under way while a short one's first append is refused. -> the long one's first
    token after the fault's end, and the short one's."""
    control, long, short = redis.Redis.from_url(stack.redis_url), {}, {}
    threads = [
        threading.Thread(target=first_token, args=(stack, body, found))
        for body, found in [(LONG, long), (SHORT, short)]
    ]
    threads[0].start()
    held_by_prefill(control, long)
    threads[1].start()
    held_by_prefill(control, short)
    ended = fault(stack, kind, seconds)
    for thread in threads:
        thread.join()
    return long["first"] - ended, short["first"] - ended


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--fault", choices=("stop", "refuse"), default="stop")
    parser.add_argument("--at", choices=("decode", "prefill"), default="decode")
    parser.add_argument("--beside", action="store_true", help="--at prefill: a short prompt refused beside it")
    parser.add_argument("--chunk", type=int, default=0, help="DAYZERO_PREFILL_CHUNK_SIZE (0: its default)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--fault-s", type=float, default=7.0)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--lease", type=float, default=20.0)
    args = parser.parse_args()
    settings = {"DAYZERO_LEASE_S": str(args.lease), "DAYZERO_KEEPALIVE_S": "1.0", "OMP_NUM_THREADS": "1"}
    if args.chunk:
        settings["DAYZERO_PREFILL_CHUNK_SIZE"] = str(args.chunk)
    with scratch() as tmp, demo_stack(tmp, {"vision": 0, "prefill": 1, "decode": 1}, settings, fp4=True) as stack:
        if args.at == "prefill":
            prefill(stack, args)
            return
        expected = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]
        rows = [trial(stack, args.fault, args.fault_s, args.after) for _ in range(args.trials)]
        drops = (stack.log_dir / "decode0.log").read_text().count("lease lost; dropping")
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
    if args.beside:
        rows = [beside_trial(stack, args.fault, args.fault_s) for _ in range(args.trials)]
        chunk = f"chunks of {args.chunk} tokens" if args.chunk else "default chunks"
        print(
            f"fault: {args.fault} {args.fault_s:g} s once prefill holds a {len(LONG['prompt'])}-token prompt ({chunk})"
        )
        print(f"and a {len(SHORT['prompt'])}-token one: first token after the fault's end")
        print("the long prompt:", " ".join(f"{t:.2f} s" for t, _ in rows))
        print("the short prompt:", " ".join(f"{t:.2f} s" for _, t in rows))
        return
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
