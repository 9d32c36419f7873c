"""The gateway's read of a token, A/B of two source trees: a stream entry written to Redis -> the
gateway's subscriber has it (the "gateway read" hop of ``overhead.py``, without the stack around it).

One Redis; per round, one process per tree (its ``shared/`` and ``services/`` imported) runs the
gateway's ``StreamHub`` over it: for each of ``--entries`` streams in turn, it subscribes, lets the
hub's read block, and a thread with its own connection XADDs the stream's first token; the time
from that XADD's send to the subscriber's ``next`` returning (one clock, one process). Rounds
alternate the trees' order. ``ttft_ab.py`` times the whole first token, whose forward on a loaded
machine carries far more noise than a change to this hop (tenths of a millisecond). Run:
``python bench/gateway_read_ab.py TREE_A TREE_B [--rounds 6] [--entries 150]`` (e.g. a ``git
worktree`` of main against the working tree).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from pathlib import Path

from options import bench_parser
from tree_ab import alternated, print_rounds


async def _reads(url: str, n: int) -> list[float]:
    """In a tree's process: ``n`` entries' times from XADD sent to the subscriber having it."""
    import redis
    import redis.asyncio as aioredis

    from dayzero.serving.keys import key
    from dayzero.serving.records import Token, encode
    from services.gateway.streams import StreamHub

    commands, writer = aioredis.Redis.from_url(url), redis.Redis.from_url(url)
    hub, times = StreamHub(url, commands, block_ms=60_000), []
    for i in range(n):
        rid = f"read-{os.getpid()}-{i}"
        async with hub.subscribe(rid) as sub:
            await asyncio.sleep(0.02)  # the hub's read blocks with this stream in it
            sent: list[float] = []

            def write(rid: str = rid, sent: list[float] = sent) -> None:
                sent.append(time.perf_counter())
                writer.xadd(key("tokens", rid), encode(Token(rid, 0, 5, "a")), id="1-0")

            thread = threading.Thread(target=write)
            thread.start()
            await sub.next(10)
            times.append(time.perf_counter() - sent[0])
            thread.join()
        await asyncio.sleep(0.01)
    await hub.close()
    await commands.aclose()
    writer.close()
    return times


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/ and services/)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--entries", type=int, default=150, help="entries each tree reads a round")
    parser.add_argument("--child", metavar="REDIS_URL", help=argparse.SUPPRESS)  # (a tree's own process)
    args = parser.parse_args()
    if args.child:  # a tree's process: its median, in us
        print(statistics.median(asyncio.run(_reads(args.child, args.entries))) * 1e6)
        return
    trees = [tree.resolve() for tree in args.trees]
    medians = alternated(__file__, trees, args.rounds, ["--entries", str(args.entries)])
    print(f"XADD sent -> the gateway's subscriber has the entry, us; p50 of {args.entries} entries a round, ")
    print_rounds(trees, medians, digits=0)


if __name__ == "__main__":
    main()
