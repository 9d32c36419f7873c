"""Workers' broker connections lost while requests run: re-deliveries and work done twice.

Starts a stack of 1 prefill and ``--decode`` decode workers on the demo checkpoint, streams
``--requests`` greedy requests once undisturbed (the reference texts), then again and, once they run
(``--at prefill``: 2,500-token prompts, as soon as prefill holds one; ``--at decode``: short prompts,
300 tokens each, once decode holds every one), closes every worker's broker connection (``CLIENT KILL`` of
the connections ``queue_reads.QueueReads`` names): Celery reconnects and its tasks run on. Reports, for the
disturbed round against the undisturbed one: the messages pushed back onto a stage's queue by
kombu (re-deliveries: LPUSH/RPUSH outside dayzero's scripts, seen by MONITOR), the prompt tokens
prefilled and the tokens decoded (counted by the workers: more than the undisturbed round's is
work done twice), the streams equal to their reference, those that did not end with "length", and
the workers' "lease lapsed ... dropping this run" lines (a duplicate run that lost).
Run: ``python bench/broker_connection_loss.py [--at prefill|decode] [--requests 4] [--decode 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time

import httpx
import redis
from demo_stack import QUICK_LEASES, demo_stack, scratch
from options import bench_parser

from dayzero.stack import Stack

MODEL = "dayzero-demo"
QUEUE_PUSH = re.compile(r"^[LR]PUSH (vision|prefill|decode) ")


def body(at: str, i: int) -> dict:
    if at == "prefill":
        prompt, max_tokens = [(7 * i + j) % 200 + 3 for j in range(2500)], 40
    else:
        prompt, max_tokens = [0, 5 + i, 6, 7 + i], 300
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


def stream(url: str, request: dict, out: dict, i: int) -> None:
    pieces, last = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json={**request, "stream": True}, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                last = data["error"].get("code")
                break
            pieces.append(data["choices"][0]["text"])
            last = data["choices"][0]["finish_reason"] or last
    out[i] = ("".join(pieces), last)


def tokens_counted(r: redis.Redis) -> dict[str, float]:
    """Tokens each stage's workers counted (prefill: prompt tokens consumed), from their snapshots."""
    counted: dict[str, float] = {}
    for k in r.scan_iter("dz:usage:*"):
        usage = json.loads(r.get(k))
        counted[usage["stage"]] = counted.get(usage["stage"], 0.0) + usage["counters"].get("tokens", 0.0)
    return counted


def held_by(r: redis.Redis, stage: str) -> int:
    """How many requests workers of ``stage`` hold (their leases)."""
    return sum((r.get(k) or b"").startswith(stage.encode()) for k in r.scan_iter("dz:lease:*"))


def one_round(stack: Stack, args: argparse.Namespace, kill: bool) -> tuple[dict, int]:
    r, out = redis.Redis.from_url(stack.redis_url), {}
    readers = [
        threading.Thread(target=stream, args=(stack.url, body(args.at, i), out, i)) for i in range(args.requests)
    ]
    for reader in readers:
        reader.start()
    killed = 0
    if kill:
        wanted = 1 if args.at == "prefill" else args.requests  # (decode: every request decoding)
        while held_by(r, args.at) < wanted:
            time.sleep(0.005)
        for client in r.client_list():
            if client.get("name", "").startswith("dayzero-reads-"):
                r.execute_command("CLIENT", "KILL", "ID", client["id"])
                killed += 1
    for reader in readers:
        reader.join(600)
    return out, killed


def settled(r: redis.Redis, seconds: float = 3.0) -> dict[str, float]:
    """The workers' counts once their snapshots (a quarter lease apart) have caught up."""
    time.sleep(seconds)
    return tokens_counted(r)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--at", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--decode", type=int, default=1)
    args = parser.parse_args()
    workers = {"vision": 0, "prefill": 1, "decode": args.decode}
    with scratch() as tmp, demo_stack(tmp, workers, QUICK_LEASES, fp4=True) as stack:
        r, pushes = redis.Redis.from_url(stack.redis_url), []
        monitor = redis.Redis.from_url(stack.redis_url, socket_timeout=None).monitor()

        def watch() -> None:
            with contextlib.suppress(redis.RedisError, OSError), monitor as m:  # (closed with the stack)
                for command in m.listen():
                    if QUEUE_PUSH.match(command["command"]) and command.get("client_type") != "lua":
                        pushes.append(command["command"][:40])

        threading.Thread(target=watch, daemon=True).start()
        before = settled(r, 0)
        reference, _ = one_round(stack, args, kill=False)
        undisturbed = settled(r)
        got, killed = one_round(stack, args, kill=True)
        disturbed = settled(r)
        logs = "".join(p.read_text(errors="replace") for p in stack.log_dir.glob("*0.log"))
    print(f"at {args.at}: {args.requests} requests, {args.decode} decode worker(s); {killed} connections killed")
    print("| | undisturbed | connections killed |")
    print("|---|---|---|")
    for stage in ("prefill", "decode"):
        once, twice = undisturbed.get(stage, 0) - before.get(stage, 0), disturbed.get(stage, 0) - undisturbed[stage]
        print(f"| {stage} tokens counted | {once:.0f} | {twice:.0f} |")
    print(f"| messages pushed back by kombu | | {len(pushes)} |")
    same = sum(got[i][0] == reference[i][0] for i in range(args.requests))
    ended = sum(got[i][1] != "length" for i in range(args.requests))
    print(f"| streams equal to the reference | | {same}/{args.requests} |")
    print(f"| streams not ended by length | | {ended} |")
    print(f"| duplicate runs dropped (log) | | {logs.count('it was re-run (or it ended): dropping this run')} |")


if __name__ == "__main__":
    main()
