"""What a stream's client leaving while Redis refuses writes costs once Redis takes them again: the
gateway's leave is refused, tried again, and its cancel goes to Redis due
``DAYZERO_REFUSED_CANCEL_AFTER_S`` (7 s) later for a resume on another gateway, when one runs on the
Redis (dayzero.serving.gateways); a gateway alone cancels at once.

A stack of 1 prefill and 1 decode worker on the demo checkpoint (disconnect grace ``--grace`` s):
per round a long stream (``ignore_eos``), 10 events read, Redis refuses writes (``maxmemory 1``), the
client leaves, ``--refusal`` s later Redis takes writes again; then the seconds until the request
ended (its ``done`` mark) and the tokens it generated past the client's last. Settings: ``up's own
Redis`` (embedded), ``user's Redis`` (a redis-server of the bench's, the gateway alone on it),
``another gateway`` (the same, another gateway's stamp in ``dz:gateways``: the 7 s wait for its
resumes). Medians of ``--rounds`` per setting, one stack after the other. Run:
``python bench/refused_stream_cancel.py [--rounds 3] [--refusal 3] [--grace 1]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key

LONG = {"model": "dayzero-demo", "prompt": [0, 5, 6], "max_tokens": 3000, "ignore_eos": True, "stream": True}
SETTINGS = ("up's own Redis", "user's Redis", "another gateway")  # (see the docstring)
GIVE_UP_S = 60.0


def one_round(url: str, r: redis.Redis, refusal_s: float) -> tuple[float, int, str]:
    """Seconds from Redis taking writes to the request's end, tokens past the client's last, its end."""
    events, got, rid = 0, 0, ""
    with httpx.stream("POST", f"{url}/v1/completions", json=LONG, timeout=60) as response:
        rid = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("id: "):  # an event's last entry: index + 1, the tokens read (an event may hold several)
                got = int(line[4:].split("-")[0])
            if line.startswith("data: {") and "error" not in json.loads(line[6:]):
                events += 1
            if events == 10:
                break
        r.config_set("maxmemory", 1)
    try:
        time.sleep(refusal_s)  # (the client left as the block above closed its stream)
    finally:
        r.config_set("maxmemory", 0)
    back = time.monotonic()
    while not (done := r.get(key("done", rid))) and time.monotonic() - back < GIVE_UP_S:
        time.sleep(0.05)
    ended = time.monotonic() - back
    last = r.xrevrange(key("tokens", rid), count=1)
    generated = int(last[0][1][b"i"]) + (int(last[0][1][b"t"]) >= 0) if last else 0
    return ended, generated - got, done.decode() if done else "running"


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--refusal", type=float, default=3.0, help="seconds Redis refuses writes")
    parser.add_argument("--grace", type=float, default=1.0, help="DAYZERO_DISCONNECT_GRACE_S")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    results: dict[str, list[tuple[float, int, str]]] = {}
    env = {**QUICK_LEASES, "DAYZERO_DISCONNECT_GRACE_S": str(args.grace)}
    for name in SETTINGS:
        with contextlib.ExitStack() as held:
            tmp = Path(held.enter_context(scratch()))
            url = None if name == "up's own Redis" else f"redis://127.0.0.1:{held.enter_context(scratch_redis())}/0"
            stack = held.enter_context(demo_stack(tmp, {"vision": 0, "prefill": 1, "decode": 1}, env, redis_url=url))
            r = redis.Redis.from_url(stack.redis_url)
            for i in range(args.rounds):
                if name == "another gateway":  # (its reaper's stamp, fresh each round)
                    r.zadd(key("gateways"), {"another gateway": r.time()[0]})
                results.setdefault(name, []).append(one_round(stack.url, r, args.refusal))
                ended, tokens, end = results[name][-1]
                print(f"{name} round {i + 1}: ended {ended:.2f} s after Redis took writes, {tokens} tokens on, {end}")
    print(f"\nmedians of {args.rounds} rounds (refusal {args.refusal:g} s, grace {args.grace:g} s)")
    print(f"{'setting':<14}{'ended, s':>10}{'tokens for nobody':>19}  ends")
    for name, rounds in results.items():
        ended, tokens = statistics.median(x[0] for x in rounds), statistics.median(x[1] for x in rounds)
        print(f"{name:<14}{ended:>10.2f}{tokens:>19.0f}  {', '.join(x[2] for x in rounds)}")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
