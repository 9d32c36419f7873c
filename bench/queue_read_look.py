"""What one look for a worker's queue read costs (``queue_reads.QueueReads.end_now_or_next``: at a
worker's stop and at each new pause before a hand back, the read looked for every ``AGAIN_S`` for
``READ_S`` while none comes, its consumer having seen the pause), with N other clients in Redis and
the worker's own two (its consumer's, its producer's): the CLIENT calls sent, Redis's time on them
(INFO commandstats) and this process's CPU. Real Redis (embedded).

    .venv/bin/python bench/queue_read_look.py [--clients 150 500 1000] [--looks 3]
"""

from __future__ import annotations

import time

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.queue_reads import QueueReads


def look(url: str, r: redis.Redis) -> str:
    reads = QueueReads()
    mine = [redis.Redis.from_url(url, client_name=reads.name) for _ in range(2)]
    for client in mine:
        client.ping()
    r.config_resetstat()
    cpu = time.process_time()
    reads.end_now_or_next(r)
    while reads._looking_until is not None:  # (the look's thread)
        time.sleep(0.05)
    cpu = time.process_time() - cpu
    stat = r.info("commandstats").get("cmdstat_client", {})
    for client in mine:
        client.close()
    redis_ms = stat.get("usec", 0) / 1e3
    return f"{stat.get('calls')} CLIENT calls, Redis {redis_ms:.1f} ms, this process {cpu * 1e3:.0f} ms"


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--clients", type=int, nargs="+", default=[150, 500, 1000])
    parser.add_argument("--looks", type=int, default=3)
    args = parser.parse_args()
    with scratch_redis() as port:
        url = f"redis://127.0.0.1:{port}"
        r, others = redis.Redis.from_url(url), []
        for n in args.clients:
            while len(others) < n:
                others.append(redis.Redis.from_url(url, client_name=f"other-{len(others)}"))
                others[-1].ping()
            print(f"{n} clients: " + " | ".join(look(url, r) for _ in range(args.looks)), flush=True)


if __name__ == "__main__":
    main()
