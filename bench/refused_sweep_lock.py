"""A Redis user refused a command its sweep sends under the sweep's lock, two gateways on the Redis as
two users (``dz`` refused LRANGE, a stand-in sweep's; ``dz2`` allowed), fresh each round (random
phases): how many of the refused gateway's /ready answers (one each 0.05 s for ``WATCH_S`` after its
first refused one) were healthy (the flap) and how many sweeps each gateway won meanwhile (the
stand-in's lock taken, refused or not), then, the ACL lifted, how many periods till its /ready no
longer says the refusal (capped at ``CAP_PERIODS``). Each round with the pass after a lost sweep a
period on or timed to the lock's lapse (``reaper.lock_left_s``), and a refused sweep's lock kept (to
its lapse) or given back (``reaper._give_back``: now). Real Redis,
the gateways in-process (their reapers' loops as they run); medians of ``--rounds``.

    PYTHONPATH=shared:. .venv/bin/python bench/refused_sweep_lock.py [--lease-s 0.4] [--rounds 3]
"""

from __future__ import annotations

import collections
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
from dayzero.serving import reaper
from dayzero.settings import Settings
from services.gateway import reaping
from services.gateway.app import make_app
from tests.services.sweep_stand_ins import sweep_sending_lrange_under_its_lock
from tests.services.test_refused_command_state import GRANTS

WATCH_S, CAP_PERIODS = 5.0, 150  # (/ready watched while refused; the wait once lifted, in periods)
KEPT, GIVE_BACK = (lambda r, token: None), reaper._give_back
VARIANTS = {  # -> (the wait to the lock's lapse, what a refused sweep does with its lock)
    "a period on, lock kept": (lambda r: math.inf, KEPT),
    "at the lock's lapse, lock kept": (reaping.lock_left_s, KEPT),
    "at the lock's lapse, given back (now)": (reaping.lock_left_s, GIVE_BACK),
}
WON: collections.Counter[str] = collections.Counter()  # sweeps whose lock each user's gateway took


def sweep_counted(store, *args):
    """The stand-in sweep, each lock it takes counted for its gateway's user (a refused one's too)."""
    user = store.r.connection_pool.connection_kwargs["username"]
    try:
        swept = sweep_sending_lrange_under_its_lock(store, *args)
    except redis.RedisError:
        WON[user] += 1
        raise
    WON[user] += swept is not None
    return swept


def refused(gateway: TestClient) -> bool:
    return "'lrange'" in gateway.get("/ready").json().get("reason", "")


def one_round(checkpoint: Path, logs: Path, args) -> tuple[int, int, float, int, int]:
    """-> (healthy answers after the first refused one, answers, periods till cleared once lifted, the
    sweeps the refused gateway and the other won while watched)."""
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
            WON.clear()
            while time.monotonic() < until:
                answers.append(refused(refused_gw))
                time.sleep(0.05)
            won = dict(WON)
            client.acl_setuser("dz", commands=["+@all"], **GRANTS)
            lifted = time.monotonic()
            while refused(refused_gw) and time.monotonic() < lifted + CAP_PERIODS * period:
                time.sleep(0.02)
            cleared = (time.monotonic() - lifted) / period
            return answers.count(False), len(answers), cleared, won.get("dz", 0), won.get("dz2", 0)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--lease-s", type=float, default=0.4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reaping.sweep = sweep_counted  # (the tests' stand-in)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_demo_checkpoint(Path(scratch) / "ckpt", vision=True, fp4=True)
        results = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, (lock_left, lock_given_back) in VARIANTS.items():
                reaping.lock_left_s, reaper._give_back = lock_left, lock_given_back
                results[name].append(one_round(checkpoint, Path(scratch), args))
        period = args.lease_s / 2
        for name, rounds in results.items():
            healthy = [f"{h}/{n}" for h, n, *_ in rounds]
            cleared = [round(c, 1) for _, _, c, *_ in rounds]
            won = [f"{dz}:{dz2}" for *_, dz, dz2 in rounds]
            others = statistics.median(dz2 for *_, dz2 in rounds)
            print(
                f"{name}: healthy after the first refused {healthy}; sweeps won refused:other {won} "
                f"(the other's median {others:g} of {WATCH_S / period:.0f} periods); "
                f"periods till cleared {cleared} (median {statistics.median(cleared):.1f}, cap {CAP_PERIODS:g})"
            )


if __name__ == "__main__":
    main()
