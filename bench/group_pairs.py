"""MoE's grouping of a step's routed (token, slot) pairs by expert on one CPU rank (``moe._group_pairs``):
torch's stable sort and counting scatter against numpy on the ids read back, by pairs (tokens x k).

The numpy path (ids read back as Python ints) saves a few torch ops a layer at a decode batch's
pairs and loses from a few dozen on (a prefill chunk's: ~1 ms a layer from ~512 pairs); the tree
takes it up to ``HOST_GROUPED_PAIRS``: the "chosen" column. Median of runs, each the mean of
``--calls`` calls. Run: ``python bench/group_pairs.py [--tokens 1 8 16 32 128 512 2048] [--k 2]
[--experts 8] [--runs 9] [--calls 30]``.
"""

from __future__ import annotations

import statistics
import time

import torch
from options import bench_parser

from dayzero.model import moe
from dayzero.parallel import Group


def per_call_us(experts: torch.Tensor, n_experts: int, host_pairs: int, runs: int, calls: int) -> float:
    """Median over ``runs`` of a call's microseconds, numpy taken up to ``host_pairs`` pairs."""
    kept, moe.HOST_GROUPED_PAIRS = moe.HOST_GROUPED_PAIRS, host_pairs
    try:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(calls):
                moe._group_pairs(experts, n_experts, Group())
            times.append((time.perf_counter() - start) / calls)
    finally:
        moe.HOST_GROUPED_PAIRS = kept
    return statistics.median(times) * 1e6


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 16, 32, 128, 512, 2048])
    parser.add_argument("--k", type=int, default=2, help="experts a token picks (the demo's 2)")
    parser.add_argument("--experts", type=int, default=8, help="routed experts (the demo's 8)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    print(f"one CPU rank, {args.experts} experts, k = {args.k}; HOST_GROUPED_PAIRS = {moe.HOST_GROUPED_PAIRS}")
    print("| tokens | pairs | torch us | numpy us | chosen us |")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for tokens in args.tokens:
            experts = torch.stack([torch.randperm(args.experts)[: args.k] for _ in range(tokens)])
            pairs = experts.numel()
            cells = [per_call_us(experts, args.experts, h, args.runs, args.calls) for h in (0, pairs)]
            chosen = per_call_us(experts, args.experts, moe.HOST_GROUPED_PAIRS, args.runs, args.calls)
            print(f"| {tokens} | {pairs} | {cells[0]:.1f} | {cells[1]:.1f} | {chosen:.1f} |")


if __name__ == "__main__":
    main()
