"""Milliseconds of one lease heartbeat (``Lifecycle.heartbeat``: one HEARTBEAT script call) for
``--leases`` leases a worker holds, without and with the parked states' keys (``parked``: decode's
beats keep kvstate:{id} alive with the lease while a Redis-carried state waits, claimed, not
imported; every other beat leaves them alone: shm and cuda_ipc park none in Redis, and an imported
state is gone. Before, a decode worker that had claimed one such state named every held request's
kvstate in every beat, a missing key once imported: the ``with`` row for every request it
generated): the call's wall time and Redis's own (INFO commandstats' EVALSHA usec, reset before each
call; steadier on a loaded machine). Real Redis (embedded), one client, each lease held, no state
parked (shm's case); the two kinds alternate, medians of ``--rounds`` calls each.

    .venv/bin/python bench/heartbeat_keys.py [--leases 3000] [--rounds 15]
"""

from __future__ import annotations

import statistics
import time

import redis
from options import bench_parser

from dayzero.procs import scratch_redis
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with scratch_redis() as port:
        store = Lifecycle(redis.Redis(port=port))
        rids = [f"beaten-{i}" for i in range(args.leases)]
        runs = dict.fromkeys(rids, 0)
        for rid in rids:
            store.r.set(key("lease", rid), "worker", px=600_000)
            store.r.set(key("attempt", rid), 0)
            store.r.set(key("req", rid), "{}")
        took: dict[bool, list[float]] = {False: [], True: []}
        spent: dict[bool, list[float]] = {False: [], True: []}  # ms in Redis
        for parked in took:  # (the script loaded)
            assert store.heartbeat(rids, "worker", 600, runs, rids if parked else ()) == []
        for _ in range(args.rounds):
            for parked, times in took.items():
                store.r.config_resetstat()
                start = time.perf_counter()
                store.heartbeat(rids, "worker", 600, runs, rids if parked else ())
                times.append(time.perf_counter() - start)
                spent[parked].append(store.r.info("commandstats")["cmdstat_evalsha"]["usec"] / 1e3)
        for parked, times in took.items():
            kind = "with kvstate (decode, redis)" if parked else "without (shm, cuda_ipc, ...)"
            wall, in_redis = 1e3 * statistics.median(times), statistics.median(spent[parked])
            print(
                f"{kind:>30}: {args.leases} leases, a beat {wall:6.1f} ms wall, {in_redis:5.1f} ms in Redis (medians)"
            )


if __name__ == "__main__":
    main()
