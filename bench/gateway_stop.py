"""Requests with bodies while their gateway stops (SIGTERM): does each one complete or get a 503
``shutting_down`` with Retry-After, or is its connection dropped under it?

Starts a stack of 1 prefill and 1 decode worker on the demo checkpoint; per round, client threads
post non-streamed completions without pause (on keep-alive connections, on a new connection each,
and bodies sent slowly, in pieces over up to ``--slow-s`` seconds), the gateway is SIGTERMed at a
random moment, and its supervisor starts it again. Every request sent before the gateway exited is
counted by its outcome: 200, 503 ``shutting_down`` (with Retry-After), another status, a refused
connection (nothing sent: the client knows, and retries), or a dropped one (the request sent, its
connection closed or reset without an answer: the client cannot tell whether it ran). Prints the
counts and each drop's time against the SIGTERM.
Run: ``python bench/gateway_stop.py [--rounds 8] [--clients 6] [--slow-s 2]``.
"""

from __future__ import annotations

import collections
import random
import signal
import threading
import time

import httpx
from demo_stack import demo_stack, scratch
from options import bench_parser

MODEL = "dayzero-demo"
KINDS = ("keep-alive", "new connection", "slow body")


def body(rng: random.Random) -> dict:
    return {"model": MODEL, "prompt": [0, *rng.sample(range(2, 500), 6)], "max_tokens": rng.choice([1, 4, 16, 48])}


def slowly(payload: bytes, seconds: float):
    """``payload`` in 8 pieces over ``seconds``."""
    step = max(1, len(payload) // 8)
    for i in range(0, len(payload), step):
        time.sleep(seconds / 8)
        yield payload[i : i + step]


def error_code(r: httpx.Response) -> str:
    """An error answer's code (OpenAI's error body), or what else it was."""
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI's error body: {r.text[:40]!r}"


class Round:
    def __init__(self, url: str, clients: int, slow_s: float, seed: int) -> None:
        self.url, self.slow_s, self.rng = url, slow_s, random.Random(seed)
        self.outcomes: list[tuple[str, str, float, float]] = []  # kind, outcome, sent, answered (unix)
        self.lock, self.done = threading.Lock(), threading.Event()
        self.threads = [
            threading.Thread(target=self.client, args=(KINDS[i % len(KINDS)], seed * 100 + i), daemon=True)
            for i in range(clients)
        ]

    def client(self, kind: str, seed: int) -> None:
        rng = random.Random(seed)
        http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(60, connect=5))
        while not self.done.is_set():
            payload = httpx.Request("POST", "/", json=body(rng)).read()
            headers = {"content-type": "application/json", "content-length": str(len(payload))}
            sent = time.time()
            try:
                if kind == "new connection":
                    r = httpx.post(f"{self.url}/v1/completions", content=payload, headers=headers, timeout=60)
                elif kind == "slow body":
                    content = slowly(payload, rng.uniform(0.1, self.slow_s))
                    r = http.post("/v1/completions", content=content, headers=headers)
                else:
                    r = http.post("/v1/completions", content=payload, headers=headers)
                code = error_code(r) if r.status_code != 200 else None
                retry = "" if r.status_code == 200 or r.headers.get("retry-after") else " WITHOUT Retry-After"
                outcome = f"{r.status_code} {code or ''}{retry}".strip()
            except httpx.ConnectError:
                outcome = "refused"
            except httpx.TransportError as exc:
                outcome = f"dropped ({type(exc).__name__})"
            with self.lock:
                self.outcomes.append((kind, outcome, sent, time.time()))
            if outcome == "refused":
                time.sleep(0.2)
        http.close()


def run(rounds: int, clients: int, slow_s: float) -> None:
    counts: collections.Counter = collections.Counter()
    drops = []
    settings = {"DAYZERO_LEASE_S": "1.0", "DAYZERO_MAX_BATCH": "16"}
    with scratch() as tmp, demo_stack(tmp, {"vision": 0, "prefill": 1, "decode": 1}, settings, fp4=True) as stack:
        for n in range(rounds):
            one = Round(stack.url, clients, slow_s, n)
            for thread in one.threads:
                thread.start()
            time.sleep(one.rng.uniform(1.0, 3.0))
            gateway = stack.child("gateway").proc
            stopped = time.time()
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(timeout=60)
            exited = time.time()
            one.done.set()
            for thread in one.threads:
                thread.join(70)
            for kind, outcome, sent, answered in one.outcomes:
                if sent > exited:
                    continue
                counts[(kind, outcome)] += 1
                if outcome.startswith("dropped"):
                    drops.append((n, kind, outcome, sent - stopped, answered - stopped))
            print(f"round {n}: gateway exited {exited - stopped:.2f} s after its SIGTERM", flush=True)
            assert stack.supervise() == ["gateway"]
            stack.wait_ready(timeout_s=120)
    print("\noutcome of each request sent before its gateway exited (kind, outcome: count)")
    for (kind, outcome), count in sorted(counts.items()):
        print(f"  {kind:15s} {outcome:40s} {count}")
    print(f"dropped: {len(drops)}")
    for n, kind, outcome, sent, answered in drops:
        print(f"  round {n} {kind}: sent {sent:+.3f} s, {outcome} {answered:+.3f} s (against the SIGTERM)")


if __name__ == "__main__":
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--slow-s", type=float, default=2.0)
    args = parser.parse_args()
    run(args.rounds, args.clients, args.slow_s)
