"""Round trips to Redis per gateway reaper pass (services/gateway/reaping.py's ``one_pass``), no request
in flight, by how the stages are served: each stage proven (a process ready a minute), one young
(ready 2 s), decode without a worker, none served (a gateway alone). A round trip is one send on a
connection (a pipeline's or a script's: one), and a pass's median time: the stages' no-worker counts
read a stage at a time (``unserved_for`` each, as before) and all at once (``unserved_stages``, the
pass's now). Real Redis (embedded); the stamps written as a worker's.

    .venv/bin/python bench/reaper_round_trips.py [--passes 20]
"""

from __future__ import annotations

import statistics
import time

import redis
import redis.connection
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.keys import QUEUES, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.no_worker_count import unserved_for, unserved_stages
from dayzero.serving.reaper import OverdueWaits, end_unserved, sweep
from dayzero.serving.watching import cancel_left

SENDS = [0]


def counted(send):
    def wrapper(self, *args, **kwargs):
        SENDS[0] += 1
        return send(self, *args, **kwargs)

    return wrapper


def stamp(client: redis.Redis, ready_ago: dict[str, float | None]) -> None:
    """One process per stage: stamped now, ready ``ready_ago`` s (None: no process)."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    for stage in QUEUES:
        client.delete(key("alive", stage), key("ready", stage))
        if ready_ago.get(stage) is not None:
            client.hset(key("alive", stage), "host:1", repr(now))
            client.hset(key("ready", stage), "host:1", repr(now - ready_ago[stage]))


COUNTS = {  # the no-worker counts' reads: a stage at a time (before), every stage at once (the pass's now)
    "a stage at a time": lambda client: {stage: unserved_for(client, stage) for stage in QUEUES},
    "all at once": lambda client: unserved_stages(client, QUEUES),
}


def one_pass(store: Lifecycle, overdue: OverdueWaits, counts) -> None:
    sweep(store, lambda job, stage: None, 30.0, 450, 5.0)
    store.r.delete(key("reaper"))  # (the next pass sweeps too, as one gateway alone would, a lease on)
    SENDS[0] -= 1  # (not counted: the bench's own)
    unserved = counts(store.r)
    overdue.end()  # (first, as the gateway's pass: the cancelled waits)
    end_unserved(store, unserved.__getitem__, 600.0)
    cancel_left(store.r, 600)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    redis.connection.Connection.send_packed_command = counted(redis.connection.Connection.send_packed_command)
    cases = {
        "every stage proven": {s: 60.0 for s in QUEUES},
        "prefill young": {**{s: 60.0 for s in QUEUES}, "prefill": 2.0},
        "decode unserved": {"vision": 60.0, "prefill": 60.0},
        "none served": {},
    }
    with scratch_redis() as port:
        store = Lifecycle.connect(f"redis://127.0.0.1:{port}/0")
        overdue = OverdueWaits(store, 3600, None)
        for case, ready_ago in cases.items():
            shown = []
            for way, counts in COUNTS.items():
                stamp(store.r, ready_ago)
                one_pass(store, overdue, counts)  # (scripts loaded, marks set)
                SENDS[0], took = 0, []
                for _ in range(args.passes):
                    began = time.perf_counter()
                    one_pass(store, overdue, counts)
                    took.append(time.perf_counter() - began)
                shown.append(f"{way} {SENDS[0] / args.passes:4.1f} ({1e6 * statistics.median(took):5.0f} us)")
            print(f"{case:>20}: round trips a pass (median time): {', '.join(shown)}")


if __name__ == "__main__":
    main()
