"""How long two hosts' torchruns take to form a group, and to form it again, under static and c10d
rendezvous: both torchruns on this machine's loopback (tests/parallel/test_torchruns.py's set-up),
one gloo rank each that all-reduces until its group fails, ``--max-restarts 3``.

Per run and rendezvous: ``start`` (both torchruns started -> both ranks in the group), ``rank 0
killed`` (rank 0 SIGKILLed; each agent restarts its rank -> the group formed again), ``host 0
again``: host 0's torchrun SIGKILLed with its rank and started again alone (a rebooted host), then
``host 1 exits`` (its agent, connected to the gone store, fails at its restart) and host 1's torchrun
started again at once, as its supervisor would -> the group formed again (``formed``). Seconds,
medians of ``--runs`` (each run's numbers are printed as it ends). No root needed. Run:
``python bench/torchrun_rendezvous.py [--runs 3] [--rdzv static c10d]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' torchrun helpers

from tests.parallel.test_hosts import _stop  # noqa: E402
from tests.parallel.test_torchruns import Torchruns  # noqa: E402

STEPS = ("start", "rank 0 killed", "host 1 exits", "formed")


def one_run(rdzv: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        runs = Torchruns(Path(tmp), rdzv)
        try:
            return measured(runs)
        finally:
            runs.stop()


def measured(runs: Torchruns) -> dict[str, float]:
    took, began = {}, time.monotonic()
    for node in (0, 1):
        runs.start(node)
    runs.formed(1)
    took["start"] = time.monotonic() - began
    runs.rank(0).kill()
    began = time.monotonic()
    runs.formed(2)
    took["rank 0 killed"] = time.monotonic() - began
    _stop([runs.agents[0]])
    began = time.monotonic()
    runs.start(0)
    runs.until(lambda: runs.agents[1].poll() is not None, "host 1's torchrun exited")
    took["host 1 exits"] = time.monotonic() - began
    runs.start(1)
    runs.formed(3)
    took["formed"] = time.monotonic() - began
    return took


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rdzv", nargs="+", default=["static", "c10d"], choices=("static", "c10d"))
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    results: dict[str, list[dict[str, float]]] = {rdzv: [] for rdzv in args.rdzv}
    for run in range(args.runs):
        for rdzv in args.rdzv:  # interleaved: the machine's load falls on both alike
            results[rdzv].append(one_run(rdzv))
            print(f"run {run + 1} {rdzv}: " + ", ".join(f"{k} {v:.1f} s" for k, v in results[rdzv][-1].items()))
    print(f"\nmedians of {args.runs} runs, s (host 1 exits / formed: after host 0's torchrun was started again)")
    print(f"{'rendezvous':<11}" + "".join(f"{step:>15}" for step in STEPS))
    for rdzv, taken in results.items():
        print(f"{rdzv:<11}" + "".join(f"{statistics.median(t[step] for t in taken):>15.1f}" for step in STEPS))
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
