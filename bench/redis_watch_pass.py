"""How long a pass of ``dayzero up``'s supervising loop waits on its Redis watch behind a frozen
sentinel (SIGSTOPped: every new connection asks it for the master, and waits out the question's
timeout, 2 s). All real processes: a master, its replica, one sentinel (tests/services/sentinel_group).
For ``--seconds`` of up's loop (a check, then 0.5 s of sleep, as cli_up), each pass's wait in the
watch: ``inline``, the ping sent from the loop's own thread (the watch before 9778da9, each due
ping: ``client.ping()``), and ``threaded``, ``RedisWatch.check()`` (the ping on a thread of its own).
Medians and maxima of the passes, each mode run ``--runs`` times back to back.
Run: ``.venv/bin/python bench/redis_watch_pass.py [--seconds 6] [--runs 3]``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import redis
from options import bench_parser

from dayzero.redis_watch import CHECK_EVERY_S, RedisWatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services.sentinel_group import sentinel_group  # noqa: E402

PASS_SLEEP_S = 0.5  # up's loop sleeps this long between passes (cli_up)


def _inline(watch: RedisWatch) -> None:
    """The watch's ping sent from the loop itself (as its check did before)."""
    with contextlib.suppress(redis.RedisError):
        watch.client.ping()


def _passes(url: str, seconds: float, threaded: bool) -> list[float]:
    """Each pass's seconds in the watch over ``seconds`` of up's loop."""
    watch = RedisWatch(url, lambda _: None)
    waits, due, until = [], 0.0, time.monotonic() + seconds
    while time.monotonic() < until:
        began = time.monotonic()
        if threaded:
            watch.check()
        elif began >= due:
            due = began + CHECK_EVERY_S
            _inline(watch)
        waits.append(time.monotonic() - began)
        time.sleep(PASS_SLEEP_S)
    return waits


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="up's loop run this long per mode and run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode, back to back")
    args = parser.parse_args()
    rows: dict[str, list[list[float]]] = {"inline": [], "threaded": []}
    with tempfile.TemporaryDirectory() as folder, sentinel_group(Path(folder)) as group:
        sentinel = group.procs["sentinel"]
        sentinel.send_signal(signal.SIGSTOP)
        try:
            for _ in range(args.runs):
                for mode in rows:
                    rows[mode].append(_passes(group.url(), args.seconds, mode == "threaded"))
        finally:
            sentinel.send_signal(signal.SIGCONT)
    print(f"up's loop behind a frozen sentinel, {args.seconds:g} s per run, {args.runs} runs per mode")
    print(f"{'mode':<10} {'passes (median)':>16} {'wait/pass median s':>19} {'wait/pass max s':>16}")
    for mode, runs in rows.items():
        passes = median(len(run) for run in runs)
        waits = [median(run) for run in runs]
        print(f"{mode:<10} {passes:>16.0f} {median(waits):>19.3f} {max(max(run) for run in runs):>16.3f}")


if __name__ == "__main__":
    main()
