"""What the gateway's admission of a JSON schema costs on large patterns (``size_problem`` under the
default limits, then ``schema_problem``: the walk of its grammar and of the patterns it never
reaches, each alone), medians of several runs, each schema and pattern new to the process (a text of
its own: no read, compile nor walk cached). Run it on two checkouts back to back to compare.

    .venv/bin/python bench/pattern_admission.py [--runs N]
"""

from __future__ import annotations

import statistics
import time

from options import bench_parser

from dayzero.chat.grammar import schema_problem
from dayzero.chat.schema_size import SchemaLimits, size_problem

DEFAULTS = SchemaLimits(3000, 100_000, 20_000)


def _optional(patterns: list[str], run: int) -> dict:
    """An object open to other properties, each pattern an optional property's."""
    return {
        "type": "object",
        "properties": {f"r{run}p{i}": {"type": "string", "pattern": p} for i, p in enumerate(patterns)},
    }


CASES = {
    "4,000-character literal": lambda run: _optional([f"^{run}" + "ab" * 1998 + "$"], run),
    "(.{2000}.*){2}": lambda run: {"type": "string", "pattern": "^(.{2000}.*){2}$", "title": str(run)},
    ".* before 790 classes": lambda run: _optional(
        [f"^{run}.*" + "".join(f"[{chr(0x4E00 + i)}]" for i in range(790)) + "$"], run
    ),
    "32 groups of varying length": lambda run: _optional([f"^{run}(a|bb){{{10 + i}}}$" for i in range(32)], run),
    "32 groups repeating a+": lambda run: _optional([f"^{run}(a+b){{{10 + i}}}$" for i in range(32)], run),
    "(a+){50} optional": lambda run: _optional([f"^{run}(a+){{50}}$"], run),
}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'schema':<30} {'median s':>9} {'min s':>7}  verdict")
    for name, build in CASES.items():
        times, verdict = [], None
        for run in range(args.runs):
            schema = build(run)
            start = time.perf_counter()
            verdict = size_problem([schema], DEFAULTS) or schema_problem(schema)
            times.append(time.perf_counter() - start)
        shown = "admitted" if verdict is None else "refused: " + verdict[:60]
        print(f"{name:<30} {statistics.median(times):>9.3f} {min(times):>7.3f}  {shown}")


if __name__ == "__main__":
    main()
