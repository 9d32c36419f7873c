"""The indexer's two compiled CPU loops for a prefill block, alone and beside CPU hogs: the scores
(kernels/indexer_cpu.weighted_relu_scores: q . key, relu, weights and head sum, its rows shared by
torch's intra-op threads) and the one-pass top-k (kernels/topk.scanned_topk), at the demo model's
indexer shapes (16 heads x 16) by default.

Each row: the median and the slowest of ``--calls`` calls (after a warm-up call), in ms. The slowest
call is where a thread the OS left waiting holds up the block. ``--hogs N`` starts N busy-looping
processes for the run (stopped at its end) to compete for the cores. Run back to back on two trees
to compare: ``OMP_NUM_THREADS=2 python bench/indexer_block.py --hogs 1``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from options import bench_parser

from dayzero.kernels.indexer_cpu import weighted_relu_scores
from dayzero.kernels.topk import scanned_topk

HOG = "while True: pass"


def call_times(fn: Callable[[], object], calls: int) -> list[float]:
    fn()  # (numba's compiled loops loaded from its cache)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rows", type=int, default=512, help="queries in the block")
    parser.add_argument("--entries", type=int, default=8192, help="compressed entries the last row sees")
    parser.add_argument("--heads", type=int, default=16, help="indexer heads")
    parser.add_argument("--depth", type=int, default=16, help="indexer head dim (<= 16: the compiled loop)")
    parser.add_argument("--topk", type=int, default=4, help="k of the top-k (<= 64: the one-pass loop)")
    parser.add_argument("--calls", type=int, default=15, help="timed calls per row")
    parser.add_argument("--hogs", type=int, default=0, help="busy-looping processes competing for the cores")
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(args.rows, args.heads, args.depth, generator=gen)
    w = torch.randn(args.rows, args.heads, generator=gen)
    keys = torch.randn(args.entries, args.depth, generator=gen)
    first = max(0, args.entries - args.rows // 4)  # a chunk at the end of a context: 4 tokens per entry
    visible = torch.linspace(first, args.entries, args.rows).to(torch.int32)
    scores = torch.empty(args.rows, args.entries)
    picked = torch.empty(args.rows, args.topk, dtype=torch.int32)
    cases = {
        f"scores [{args.rows}, {args.heads} x {args.depth}] x {args.entries}": lambda: weighted_relu_scores(
            q, w, keys, visible, scores
        ),
        f"top-{args.topk} of [{args.rows}, {args.entries}]": lambda: scanned_topk(scores, args.topk, picked),
    }
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        print(f"threads {torch.get_num_threads()}, hogs {args.hogs}")
        print("| loop | median ms | slowest ms |")
        print("|------|----------:|-----------:|")
        for name, fn in cases.items():
            times = call_times(fn, args.calls)
            print(f"| {name} | {statistics.median(times) * 1e3:.2f} | {max(times) * 1e3:.2f} |")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
