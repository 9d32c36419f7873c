"""Serving benchmark: streaming clients with Poisson arrivals against the gateway.

Reports TTFT, inter-token latency and end-to-end latency (p50/p90/p99), token throughput
and failures; then the KV handoff (shared memory publish + attach + copy) in bytes/s against
a plain memory copy of the same bytes. The pipeline's overhead on an idle stack (TTFT through
the gateway minus in-process, hop by hop) is ``bench/overhead.py``.
Starts its own stack (`dayzero up` machinery, demo checkpoint) unless --url is given; then
``--clients N`` also runs N closed-loop clients (4 requests each) and reports tokens/s and the CPU
seconds each of the stack's processes spent per 1000 tokens (psutil: user + system), and the
Redis commands per request (those inside Lua scripts too).
Run: ``python bench/serve.py [--rate 4] [--requests 64] [--clients 0] [--url http://...]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

import httpx
import torch
from handoff import bandwidth
from options import bench_parser

from dayzero.config import ModelConfig

MODEL = "dayzero-demo"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_request(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> dict:
    """Times each chunk's arrival; the tokens generated come from the stream's usage chunk (a
    token that ends inside a UTF-8 character or a tag sends no chunk of its own: the demo's
    byte-level vocabulary holds back ~40% of them)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}
    start, stamps, tokens = time.perf_counter(), [], 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False, "status": r.status_code}
            async for line in r.aiter_lines():
                if line.startswith("id:"):
                    stamps.append(time.perf_counter())
                elif line.startswith("data: {") and '"completion_tokens"' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
            # read to the body's end (past [DONE]): a stream left unread closes its connection and
            # the next request paid a new one, which a user's kept-alive client does not (sse_clients.py)
    except httpx.HTTPError as exc:
        return {"ok": False, "status": type(exc).__name__}
    if not stamps or not tokens:
        return {"ok": False, "status": "no tokens"}
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"ok": True, "ttft": stamps[0] - start, "itl": gaps, "e2e": stamps[-1] - start, "tokens": tokens}


async def load(url: str, rate: float, n: int, prompt_len: int, max_tokens: int, seed: int) -> tuple[list, float]:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=300) as client:
        tasks, start = [], time.perf_counter()
        for i in range(n):
            prompt = [0] + [rng.randrange(2, 500) for _ in range(prompt_len - 1)]
            tasks.append(asyncio.create_task(one_request(client, url, prompt, max_tokens)))
            if i < n - 1:
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


async def closed_loop(url: str, clients: int, per_client: int, prompt_len: int, max_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) with ``clients`` each sending ``per_client`` requests back to back."""
    async with httpx.AsyncClient(timeout=300) as client:

        async def one_client(c: int) -> int:
            tokens = 0
            for i in range(per_client):
                prompt = [0] + [(c * 31 + i * 7 + k) % 498 + 2 for k in range(prompt_len - 1)]
                result = await one_request(client, url, prompt, max_tokens)
                tokens += result.get("tokens", 0)
            return tokens

        start = time.perf_counter()
        total = sum(await asyncio.gather(*(one_client(c) for c in range(clients))))
        return total, time.perf_counter() - start


def redis_calls(url: str) -> dict[str, int]:
    """Redis's count of calls per command since it started (``INFO commandstats``)."""
    import redis

    stats = redis.Redis.from_url(url).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def reruns(url: str) -> int:
    """How many requests were re-run since Redis started: a re-run counts its request's attempts."""
    import redis

    return sum(1 for _ in redis.Redis.from_url(url).scan_iter("dz:attempt:*", count=1000))


def cpu_per_token(stack, clients: int, prompt_len: int, max_tokens: int) -> None:
    """Closed-loop tokens/s, each process's CPU seconds per 1000 tokens generated, and the Redis
    commands per request: the gateway's, the workers' and the broker's, each command a Lua script
    runs counted too (an EVALSHA is one round trip, its GETs and SETs are counted beside it)."""
    import psutil

    procs = {c.name: psutil.Process(c.proc.pid) for c in stack.children}
    before, calls = {name: sum(p.cpu_times()[:2]) for name, p in procs.items()}, redis_calls(stack.redis_url)
    tokens, seconds = asyncio.run(closed_loop(stack.url, clients, 4, prompt_len, max_tokens))
    print(f"closed loop, {clients} clients x 4 requests: {tokens / seconds:.1f} tokens/s; CPU s per 1000 tokens:")
    print(", ".join(f"{n} {(sum(p.cpu_times()[:2]) - before[n]) * 1000 / tokens:.3f}" for n, p in procs.items()))
    after = redis_calls(stack.redis_url)
    per_request = {name: (n - calls.get(name, 0)) / (clients * 4) for name, n in after.items()}
    top = sorted(((n, name) for name, n in per_request.items() if n >= 0.05), reverse=True)
    print(
        f"Redis commands per request: {sum(per_request.values()):.1f} ("
        + ", ".join(f"{name} {n:.1f}" for n, name in top)
        + ")"
    )
    print(f"requests the reaper re-ran (an attempt past the first): {reruns(stack.redis_url)}")


def sweep_and_plot(url: str, prompt_len: int, max_tokens: int, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates, rows = (1.0, 2.0, 4.0, 8.0), []
    for rate in rates:
        results, _ = asyncio.run(load(url, rate, 16, prompt_len, max_tokens, seed=int(rate)))
        ok = [r for r in results if r["ok"]]
        rows.append(([r["ttft"] for r in ok], [g for r in ok for g in r["itl"]]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, index, title in ((axes[0], 0, "time to first token"), (axes[1], 1, "inter-token latency")):
        for q in (0.5, 0.9, 0.99):
            ax.plot(rates, [pct(row[index], q) for row in rows], "o-", label=f"p{int(q * 100)}")
        ax.set(xlabel="requests / s (Poisson)", ylabel="seconds", title=title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "serve_latency.png", dpi=110)
    concurrency = (1, 2, 4, 8, 16)
    runs = [asyncio.run(closed_loop(url, c, 3, prompt_len, max_tokens)) for c in concurrency]
    throughput = [tokens / seconds for tokens, seconds in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(concurrency, throughput, "o-")
    ax.set(xlabel="concurrent streaming clients", ylabel="tokens / s", title="throughput vs concurrency")
    fig.tight_layout()
    fig.savefig(folder / "serve_throughput.png", dpi=110)
    print("| concurrency | tokens/s |\n|---:|---:|")
    for c, t in zip(concurrency, throughput, strict=True):
        print(f"| {c} | {t:.1f} |")
    print(f"plots: {folder / 'serve_latency.png'}, {folder / 'serve_throughput.png'}")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--url", help="a running gateway (default: start a stack here)")
    parser.add_argument("--rate", type=float, default=4.0, help="request arrivals per second (Poisson)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--decode", type=int, default=1, help="decode workers when starting a stack")
    parser.add_argument("--plot", action="store_true", help="sweep rates and concurrency, write PNG charts")
    parser.add_argument("--clients", type=int, default=0, help="closed-loop clients: throughput, CPU per token")
    args = parser.parse_args()

    from demo_stack import running, scratch, stack_on

    from dayzero.demo import write_demo_checkpoint

    with scratch() as tmp:
        checkpoint = write_demo_checkpoint(tmp / "demo")
        own = stack_on(checkpoint, {"prefill": 1, "decode": args.decode}, tmp / "logs") if args.url is None else None
        with running(own, ready_s=120) if own is not None else contextlib.nullcontext() as stack:
            url = args.url or stack.url
            asyncio.run(load(url, 2.0, 4, args.prompt_tokens, 4, seed=99))  # warm-up
            results, wall = asyncio.run(load(url, args.rate, args.requests, args.prompt_tokens, args.max_tokens, 0))
            if args.clients and stack is not None:
                cpu_per_token(stack, args.clients, args.prompt_tokens, args.max_tokens)
            if args.plot:
                sweep_and_plot(url, args.prompt_tokens, args.max_tokens, Path(__file__).parent)
        ok = [r for r in results if r["ok"]]
        ttft, e2e = [r["ttft"] for r in ok], [r["e2e"] for r in ok]
        itl = [g for r in ok for g in r["itl"]]
        tokens = sum(r["tokens"] for r in ok)
        print(
            f"{args.requests} streaming requests, Poisson {args.rate}/s, prompt {args.prompt_tokens}, "
            f"{args.max_tokens} new tokens, 1 prefill + {args.decode} decode worker(s), tiny demo model, CPU"
        )
        print("| metric | p50 | p90 | p99 |")
        print("|---|---:|---:|---:|")
        for name, values in (("TTFT s", ttft), ("ITL s (between chunks)", itl), ("E2E s", e2e)):
            print(f"| {name} | {pct(values, 0.5):.4f} | {pct(values, 0.9):.4f} | {pct(values, 0.99):.4f} |")
        print(
            f"throughput {tokens / wall:.1f} tokens/s, {len(ok) / wall:.2f} requests/s, failed {len(results) - len(ok)}"
        )
        handoff, copy, _, moved, _, _ = bandwidth(ModelConfig.from_file(checkpoint), 4096, torch.float32, runs=5)
        print(
            f"KV handoff of a 4096-token sequence ({moved / 1e6:.2f} MB): {handoff / 1e9:.2f} GB/s vs plain "
            f"memory copy {copy / 1e9:.2f} GB/s ({handoff / copy:.2f}x)"
        )
        print(json.dumps({"ttft_p50": pct(ttft, 0.5), "itl_p50": pct(itl, 0.5), "failed": len(results) - len(ok)}))


if __name__ == "__main__":
    main()
