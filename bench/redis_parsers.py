"""redis-py's reply parsers side by side: the pure-Python RESP3 parser against hiredis (C), on the
calls the pipeline makes once per decode step with B streams in flight.

Against an embedded redis-server, in one process, alternating the two parsers call by call (each
with its own client): decode's append as it was until it became a Lua script that checks each
request's run (a pipeline of B XADDs of a token's fields and an MGET of B cancel marks), and the
gateway's read of the step's tokens (one XREAD of B streams, one new entry each, on the asyncio
client as ``StreamHub`` does). The synchronous side packs its commands in Python or in hiredis
along with its parser (the asyncio client packs in Python either way). Medians of the paired calls.
The stack uses hiredis whenever it is installed (``redis[hiredis]``). Run: ``python
bench/redis_parsers.py [--batch 1,16,64] [--calls 300]``.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import redis
import redis.asyncio as aioredis
from options import bench_parser
from redis._parsers import _AsyncHiredisParser, _AsyncRESP3Parser, _HiredisParser, _RESP3Parser
from redis.connection import Encoder, HiredisRespSerializer, PythonRespSerializer

from dayzero.procs import scratch_redis

FIELDS = {"i": 17, "t": 311, "x": " the"}  # one token's entry (records.encode)


def append(client: redis.Redis, batch: int, step: int) -> None:
    pipe = client.pipeline(transaction=False)
    for s in range(batch):
        pipe.xadd(f"tokens:{s}", {**FIELDS, "i": step}, id=f"{step + 1}-0")
    pipe.mget([f"cancel:{s}" for s in range(batch)])
    pipe.execute(raise_on_error=False)


async def read(client: aioredis.Redis, batch: int, step: int) -> None:
    await client.xread({f"tokens:{s}": f"{step}-0" for s in range(batch)}, count=64)


def paired(run_a, run_b, calls: int) -> tuple[float, float]:
    """Median ms of each, called in turns (the order swapped every call)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(calls):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            (run_a, run_b)[which](i)
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def measure(batch: int, sync: list[redis.Redis], aio: list[aioredis.Redis], loop, calls: int) -> None:
    """One table row per call at ``batch`` streams: pure Python (client 0) against hiredis (client 1)."""
    sync[0].flushall()
    steps = iter(range(1, 1 << 30))  # each append adds the next entry of every stream
    slow, fast = paired(*(lambda i, c=c: append(c, batch, next(steps)) for c in sync), calls)
    print(f"| decode's append (B XADD + MGET) | {batch} | {slow:.3f} | {fast:.3f} | {slow / fast:.2f}x |")
    last = next(steps) - 1  # every stream holds entries 2-0 .. (last + 1)-0: read the newest of each
    slow, fast = paired(*(lambda i, c=c: loop.run_until_complete(read(c, batch, last)) for c in aio), calls)
    print(f"| gateway's XREAD of B streams | {batch} | {slow:.3f} | {fast:.3f} | {slow / fast:.2f}x |")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", default="1,16,64", help="streams in flight (comma-separated)")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    print("| call | batch | pure Python ms | hiredis ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    with scratch_redis() as port:
        aio: list[aioredis.Redis] = []
        try:
            python_packer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
            pools = (
                redis.ConnectionPool(port=port, parser_class=_RESP3Parser, command_packer=python_packer),
                redis.ConnectionPool(port=port, parser_class=_HiredisParser, command_packer=HiredisRespSerializer()),
            )
            sync = [redis.Redis(connection_pool=pool) for pool in pools]
            aio = [
                aioredis.Redis(connection_pool=aioredis.ConnectionPool(port=port, parser_class=p))
                for p in (_AsyncRESP3Parser, _AsyncHiredisParser)
            ]
            for batch in map(int, args.batch.split(",")):
                measure(batch, sync, aio, loop, args.calls)
        finally:
            for client in aio:
                loop.run_until_complete(client.aclose())


if __name__ == "__main__":
    main()
