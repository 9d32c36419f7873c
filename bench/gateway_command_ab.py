"""The gateway's Redis command over an open connection, A/B of two source trees: one GET (a key
that is absent) on ``bus.command_client``, its connection made before the timing, round trip from
the call to its reply (its retry, its pool, its parser: what each of the gateway's short commands
pays besides Redis).

One Redis; per round, one process per tree (its ``shared/`` and ``services/`` imported) sends
``--gets`` GETs one after another and prints their median round trip, or with ``--cpu`` the CPU
time its process spent per GET (the client's own work, which a loaded host's waits for the CPU do
not blur); rounds alternate the trees' order (``tree_ab.py``). Run: ``python
bench/gateway_command_ab.py TREE_A TREE_B [--rounds 8] [--gets 2000] [--cpu]`` (e.g. a ``git
worktree`` of main against the working tree).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from options import bench_parser
from tree_ab import alternated, print_rounds


async def _gets(url: str, n: int) -> tuple[list[float], float]:
    """In a tree's process: ``n`` GETs' round trips over the command client's open connection, s,
    and the process's CPU time per GET, s."""
    from dayzero.settings import Settings
    from services.gateway.bus import command_client

    client, times = command_client(Settings(redis_url=url)), []
    await client.ping()  # the connection made (its connect not timed)
    cpu = time.process_time()
    for _ in range(n):
        start = time.perf_counter()
        await client.get("gateway-command-ab-absent")
        times.append(time.perf_counter() - start)
    cpu = (time.process_time() - cpu) / n
    await client.aclose()
    return times, cpu


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/ and services/)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--gets", type=int, default=2000, help="GETs each tree sends a round")
    parser.add_argument("--cpu", action="store_true", help="the CPU time per GET, not the round trip")
    parser.add_argument("--child", metavar="REDIS_URL", help=argparse.SUPPRESS)  # (a tree's own process)
    args = parser.parse_args()
    if args.child:  # a tree's process: its number, in us
        times, cpu = asyncio.run(_gets(args.child, args.gets))
        print((cpu if args.cpu else statistics.median(times)) * 1e6)
        return
    trees = [tree.resolve() for tree in args.trees]
    options = ["--gets", str(args.gets), *(["--cpu"] if args.cpu else [])]
    medians = alternated(__file__, trees, args.rounds, options)
    what = "the client process's CPU time per GET" if args.cpu else "a GET's round trip, p50"
    print(f"A GET on the gateway's command client, its connection open: {what}, us, of {args.gets} a round; ")
    print_rounds(trees, medians, digits=1)


if __name__ == "__main__":
    main()
