"""How often a worker's queue read sent just as the worker withholds (``room.Prefetch.withhold``,
before a hand back) stays blocked in Redis, and for how long. The consumer, a client named as the
worker's reads and reading as kombu does (a BRPOP of ``queue_reads.READ_S``), checked that it could take
messages before the pause; its read reaches Redis within ``--window-ms`` of the withhold, either
side (a random offset per trial). A read that stays blocked takes the next message pushed meanwhile
(the worker, paused, holds it unstarted). Real Redis (embedded).

    .venv/bin/python bench/withhold_race.py [--trials 200] [--window-ms 2]
"""

from __future__ import annotations

import random
import statistics
import threading
import time

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.queue_reads import READ_S, QueueReads
from dayzero.serving.room import Prefetch

QUEUE = "withhold-race"


def trial(r: redis.Redis, consumer: redis.Redis, prefetch: Prefetch, offset_s: float) -> float:
    """One withhold with the consumer's read sent ``offset_s`` after it (before it: negative). -> the
    time from the withhold to the read's answer (a nil: ended, or its READ_S over)."""
    go, answered = threading.Barrier(2), []

    def read() -> None:
        go.wait()
        time.sleep(max(0.0, offset_s))
        consumer.brpop([QUEUE], READ_S)
        answered.append(time.perf_counter())

    reader = threading.Thread(target=read)
    reader.start()
    go.wait()
    time.sleep(max(0.0, -offset_s))
    withheld = time.perf_counter()
    prefetch.withhold(r)
    reader.join()
    return answered[0] - withheld


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--window-ms", type=float, default=2.0)
    args = parser.parse_args()
    with scratch_redis() as port:
        url = f"redis://127.0.0.1:{port}/0"
        prefetch = Prefetch(QueueReads())
        r, consumer = redis.Redis.from_url(url), redis.Redis.from_url(url, client_name=prefetch.reads.name)
        consumer.ping()
        window_s = args.window_ms / 1000
        waits = [trial(r, consumer, prefetch, random.uniform(-window_s, window_s)) for _ in range(args.trials)]
        stayed = [w for w in waits if w > READ_S / 2]
        ended = [w for w in waits if w <= READ_S / 2]
        print(f"{args.trials} withholds, reads sent within {args.window_ms} ms of each, either side")
        for what, found in (("ended", ended), ("stayed blocked", stayed)):
            if found:
                median, longest = statistics.median(found) * 1e3, max(found) * 1e3
                print(f"  {what}: {len(found)}, median {median:.1f} ms, max {longest:.1f} ms")


if __name__ == "__main__":
    main()
