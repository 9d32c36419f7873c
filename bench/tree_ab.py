"""A/B of two source trees, each round one process per tree (its ``shared/`` and ``services/``
imported) against one scratch Redis, the trees' order swapped every round (``gateway_read_ab.py``,
``gateway_command_ab.py``). Each process is the bench itself, run with ``--child REDIS_URL``: it
prints its round's number last."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def alternated(bench: str, trees: list[Path], rounds: int, options: list[str]) -> list[list[float]]:
    """Each tree's numbers, round by round, in ``trees``' order (one tree given twice, its noise: two
    rows): ``bench`` run with ``options`` and ``--child``."""
    from dayzero.procs import scratch_redis  # (the parent's; each child imports its own tree's)

    numbers: list[list[float]] = [[] for _ in trees]
    with tempfile.TemporaryDirectory() as tmp, scratch_redis(Path(tmp)) as port:
        order = list(enumerate(trees))  # (by place: a tree given twice is two)
        for r in range(rounds):
            for i, tree in order if r % 2 == 0 else order[::-1]:
                env = {**os.environ, "PYTHONPATH": f"{tree / 'shared'}:{tree}", "OMP_NUM_THREADS": "1"}
                argv = [sys.executable, bench, *map(str, trees), *options, "--child", f"redis://127.0.0.1:{port}/0"]
                out = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, check=True)
                numbers[i].append(float(out.stdout.strip().splitlines()[-1]))
    return numbers


def print_rounds(trees: list[Path], numbers: list[list[float]], digits: int) -> None:
    """The table: a row per tree (``alternated``'s), its rounds' numbers and their median."""
    rounds = len(numbers[0])
    load = os.getloadavg()
    print(f"{rounds} rounds alternated; load average after: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
    print(f"| tree | {' | '.join(f'round {r + 1}' for r in range(rounds))} | median |")
    print(f"|---|{'---:|' * (rounds + 1)}")
    for tree, values in zip(trees, numbers, strict=True):
        cells = " | ".join(f"{v:.{digits}f}" for v in values)
        print(f"| {tree} | {cells} | {statistics.median(values):.{digits}f} |")
