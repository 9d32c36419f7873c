"""Start-up cost: ``dayzero --help``, and an idle stack from launch to ready, per source tree.

For each tree (default: this one; give two to compare, e.g. a ``git worktree`` of main against
the working tree), in turns, the order swapped every round: the wall time of ``dayzero --help``
in a fresh interpreter (what every service's command pays before it does anything), then a stack
(embedded Redis, the gateway, 1 prefill and 1 decode worker, the demo checkpoint) from
``Stack.start`` to ``/ready`` answering 200 (polled every 0.3 s), the CPU seconds each process
spent to get there and its resident memory once one request has been served. A tree runs with
``PYTHONPATH`` pointing at it, from a scratch directory, so its processes import its code. Run:
``python bench/startup.py [TREE ...] [--rounds 3]``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from demo_stack import running, stack_on
from options import bench_parser

from dayzero.demo import write_demo_checkpoint


def tree_env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{tree / 'shared'}{os.pathsep}{tree}", "OMP_NUM_THREADS": "1"}


def help_s(tree: Path, scratch: Path) -> float:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "dayzero.cli", "--help"]
    subprocess.run(cmd, cwd=scratch, env={**os.environ, **tree_env(tree)}, check=True, capture_output=True)
    return time.perf_counter() - start


def stack_start(tree: Path, checkpoint: Path, scratch: Path) -> dict[str, float]:
    """Seconds to ready, then per process: CPU seconds to ready and MiB resident after a request."""
    stack = stack_on(checkpoint, {"prefill": 1, "decode": 1}, scratch / "logs", tree_env(tree))
    here = os.getcwd()
    os.chdir(scratch)  # the children's ``-m`` puts their working directory first on sys.path
    try:
        start = time.perf_counter()
        with running(stack):
            row = {"ready s": time.perf_counter() - start}
            procs = {c.name: psutil.Process(c.proc.pid) for c in stack.children if c.name != "redis"}
            for name, proc in procs.items():
                row[f"{name} cpu s"] = sum(proc.cpu_times()[:2])
            body = {"model": "dayzero-demo", "prompt": "hello", "max_tokens": 2}
            httpx.post(f"{stack.url}/v1/completions", json=body, timeout=60).raise_for_status()
            for name, proc in procs.items():
                row[f"{name} MiB"] = proc.memory_info().rss / 2**20
            return row
    finally:
        os.chdir(here)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[Path, list[dict[str, float]]] = {t: [] for t in args.trees}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_demo_checkpoint(Path(tmp) / "demo")
        for r in range(args.rounds):
            for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
                scratch = Path(tempfile.mkdtemp(dir=tmp))
                row = {"--help s": help_s(tree.resolve(), scratch)}
                row.update(stack_start(tree.resolve(), checkpoint, scratch))
                rows[tree].append(row)
                print(f"round {r + 1} {tree}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    columns = list(next(iter(rows.values()))[0])
    print(f"\nmedians of {args.rounds} rounds\n")
    print("| tree | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for tree, runs in rows.items():
        cells = [f"{statistics.median(run[c] for run in runs):.2f}" for c in columns]
        print(f"| {tree} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
