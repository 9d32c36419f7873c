"""A Redis user refused a command its sweep sends under the sweep's lock, two gateways on the Redis as
two users (``dz`` refused LRANGE, a stand-in sweep's; ``dz2`` allowed), fresh each round (random
phases): how many of the refused gateway's /ready answers (one each 0.05 s for ``WATCH_S`` after its
first refused one) were healthy (the flap), then, the ACL lifted, how many periods till its /ready no
longer says the refusal (capped at ``CAP_PERIODS``). Each round with the pass after a lost sweep
timed to the lock's lapse (``reaper.lock_left_s``: now) and without (a period on: before). Real Redis,
the gateways in-process (their reapers' loops as they run); medians of ``--rounds``.

    PYTHONPATH=shared:. .venv/bin/python bench/refused_sweep_lock.py [--lease-s 0.4] [--rounds 3]
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from pathlib import Path

import redis
from fastapi.testclient import TestClient
from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.procs import free_port, start_redis
from dayzero.settings import Settings
from services.gateway import reaping
from services.gateway.app import make_app
from tests.services.test_refused_command_state import GRANTS, sweep_sending_lrange_under_its_lock

WATCH_S, CAP_PERIODS = 5.0, 150  # (/ready watched while refused; the wait once lifted, in periods)
VARIANTS = {"a period on (before)": lambda r: math.inf, "at the lock's lapse (now)": reaping.lock_left_s}


def refused(gateway: TestClient) -> bool:
    return "'lrange'" in gateway.get("/ready").json().get("reason", "")


def one_round(checkpoint: Path, logs: Path, args) -> tuple[int, int, float]:
    """-> (healthy answers after the first refused one, answers, periods till cleared once lifted)."""
    port, period = free_port(), args.lease_s / 2
    server = start_redis(port, logs / f"redis-{port}.log")
    try:
        client = redis.Redis(port=port)
        for user in ("dz", "dz2"):
            client.acl_setuser(user, commands=["+@all"], **GRANTS)
        with contextlib.ExitStack() as stack:
            refused_gw, _ = (
                stack.enter_context(
                    TestClient(
                        make_app(
                            Settings(
                                redis_url=f"redis://{user}:pw@127.0.0.1:{port}/0",
                                checkpoint=checkpoint,
                                lease_s=args.lease_s,
                                credentials_refused_s=600,
                            )
                        )
                    )
                )
                for user in ("dz", "dz2")
            )
            client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
            while not refused(refused_gw):
                time.sleep(0.05)
            answers, until = [], time.monotonic() + WATCH_S
            while time.monotonic() < until:
                answers.append(refused(refused_gw))
                time.sleep(0.05)
            client.acl_setuser("dz", commands=["+@all"], **GRANTS)
            lifted = time.monotonic()
            while refused(refused_gw) and time.monotonic() < lifted + CAP_PERIODS * period:
                time.sleep(0.02)
            return answers.count(False), len(answers), (time.monotonic() - lifted) / period
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--lease-s", type=float, default=0.4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reaping.sweep = sweep_sending_lrange_under_its_lock  # (the tests' stand-in)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_demo_checkpoint(Path(scratch) / "ckpt", vision=True, fp4=True)
        results = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, lock_left in VARIANTS.items():
                reaping.lock_left_s = lock_left
                results[name].append(one_round(checkpoint, Path(scratch), args))
        for name, rounds in results.items():
            healthy = [f"{h}/{n}" for h, n, _ in rounds]
            cleared = [round(c, 1) for _, _, c in rounds]
            print(
                f"{name}: healthy after the first refused {healthy}; periods till cleared {cleared} "
                f"(median {statistics.median(cleared):.1f}, cap {CAP_PERIODS:g})"
            )


if __name__ == "__main__":
    main()
