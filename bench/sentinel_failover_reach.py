"""How long after a failover dayzero's Redis clients reach the new master. A master, its replica and one
sentinel (quorum 1, down after 1 s; tests/services/sentinel_group), all real processes: the master
SIGKILLed, each client sending a SET every ``--every-ms`` from a thread of its own, on the clients the
services build (``redis_clients``): the workers' and the gateway's sync store (``Lifecycle.connect``'s
keywords), the gateway's asyncio bus (``Bus``'s), up's liveness reads (``liveness.connect``). For each:
seconds from the SIGKILL to its first SET taken by the promoted replica, and from the promotion (the
sentinel naming the replica, polled every 20 ms) to it: a client that retried at the old master's
address without asking the sentinels again would lag the promotion by its retries. Medians of ``--runs``.
Run: ``.venv/bin/python bench/sentinel_failover_reach.py [--runs 3]``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median

import redis
from options import bench_parser
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from dayzero.redis_clients import async_client
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.liveness import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services.sentinel_group import sentinel_group  # noqa: E402

GIVE_UP_S = 30.0


def _sync_reach(client: redis.Redis, every_s: float, replica_port: int, out: dict, name: str) -> None:
    """Time of ``client``'s first SET the replica's port served after the kill (monotonic)."""
    until = time.monotonic() + GIVE_UP_S
    while time.monotonic() < until:
        try:
            client.set("reach", name)
            if client.connection_pool.get_master_address()[1] == replica_port:
                out[name] = time.monotonic()
                return
        except redis.RedisError:
            pass
        time.sleep(every_s)


def _async_reach(url: str, every_s: float, replica_port: int, out: dict, warm: threading.Event) -> None:
    async def run() -> None:
        client = async_client(
            url, socket_connect_timeout=2, socket_timeout=5, retry=AsyncRetry(NoBackoff(), 1, (redis.ConnectionError,))
        )
        await client.set("reach", "bus")  # (its pooled connection, to the master about to die)
        warm.set()
        until = time.monotonic() + GIVE_UP_S
        while time.monotonic() < until:
            try:
                await client.set("reach", "bus")
                if (await client.connection_pool.get_master_address())[1] == replica_port:
                    out["gateway bus (async)"] = time.monotonic()
                    break
            except redis.RedisError:
                pass
            await asyncio.sleep(every_s)
        await client.aclose()

    asyncio.run(run())


def _one_run(every_s: float) -> dict[str, float]:
    """-> each client's seconds from the kill, and the promotion's ("promotion")."""
    with tempfile.TemporaryDirectory() as folder, sentinel_group(Path(folder)) as group:
        url = group.url()
        clients: dict[str, redis.Redis] = {"store (sync)": Lifecycle.connect(url).r, "up liveness (sync)": connect(url)}
        for client in clients.values():
            client.set("reach", "warm")  # (each holds a connection to the master)
        out: dict[str, float] = {}
        warm = threading.Event()
        runs: list[Callable[[], None]] = [
            lambda n=n, c=c: _sync_reach(c, every_s, group.replica_port, out, n) for n, c in clients.items()
        ]
        runs.append(lambda: _async_reach(url, every_s, group.replica_port, out, warm))
        threads = [threading.Thread(target=run) for run in runs]
        threads[-1].start()
        warm.wait(10)
        group.procs["master"].kill()
        killed = time.monotonic()
        for thread in threads[:-1]:
            thread.start()
        while group.master_says() != group.replica_port and time.monotonic() - killed < GIVE_UP_S:
            time.sleep(0.02)
        out["promotion"] = time.monotonic()
        for thread in threads:
            thread.join()
    return {name: at - killed for name, at in out.items()}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3, help="failovers, each on a group of its own")
    parser.add_argument("--every-ms", type=float, default=50.0, help="each client's SET this often")
    args = parser.parse_args()
    runs = [_one_run(args.every_ms / 1000) for _ in range(args.runs)]
    print(f"seconds after the master's SIGKILL (median of {args.runs} failovers; down-after 1 s, quorum 1)")
    print(f"{'client':<22} {'first SET on new master':>24} {'after the promotion':>20} {'reached':>8}")
    for name in [n for n in runs[0] if n != "promotion"] + ["promotion"]:
        reached = [run[name] for run in runs if name in run]
        lag = [run[name] - run["promotion"] for run in runs if name in run]
        row = f"{median(reached):>24.2f} {median(lag):>20.2f}" if reached else f"{'never':>24} {'-':>20}"
        print(f"{name:<22} {row} {len(reached):>5}/{args.runs}")


if __name__ == "__main__":
    main()
