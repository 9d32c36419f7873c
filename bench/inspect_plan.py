"""``dayzero inspect``'s time: the plan of the released configs, as the command makes it (in process,
the interpreter and imports aside), median of ``--runs``, of the tree this bench is in (its ``shared/``
ahead of the venv's editable install, which may be another tree's). ``--trees A B``: the same cases
run on each source tree, side by side, e.g. the main checkout before a change and a clone after it.
Run: ``python bench/inspect_plan.py [--trees /work/main /tmp/clone] [--runs 5]``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from options import bench_parser

TREE = Path(__file__).resolve().parents[1]
CASES = {
    "flash": ["deepseek-v4-flash"],
    "flash --tensor-parallel 8": ["deepseek-v4-flash", "--tensor-parallel", "8"],
    "pro": ["deepseek-v4-pro"],
    "pro --tensor-parallel 8": ["deepseek-v4-pro", "--tensor-parallel", "8"],
}


def medians(tree: Path, runs: int) -> dict[str, float]:
    """Seconds per ``inspect`` of each case, on ``tree`` (one a process: its modules stay imported)."""
    sys.path[:0] = [str(tree / "shared"), str(tree)]
    from dayzero import cli

    out = {}
    for name, argv in CASES.items():
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli.main(["inspect", *argv, "--json"]) == 0
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def on_tree(tree: Path, runs: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAYZERO_")}
    argv = [sys.executable, __file__, "--runs", str(runs), "--json", "--trees", str(tree)]
    return json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--trees", nargs="*", type=Path, default=[], metavar="DIR", help="source trees to compare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one tree's medians as JSON (--trees' runs)")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(medians(args.trees[0] if args.trees else TREE, args.runs)))
        return
    columns = {str(tree): on_tree(tree, args.runs) for tree in args.trees} or {"this tree": medians(TREE, args.runs)}
    print(f"{'case':<28}" + "".join(f"{name:>20}" for name in columns) + "   (s, median of runs)")
    for case in CASES:
        print(f"{case:<28}" + "".join(f"{times[case]:>20.3f}" for times in columns.values()))


if __name__ == "__main__":
    main()
