"""What a decode step asks of the host against what it gives the device: kernel launches, host
time and device-busy time per step and per layer (issue 16's case for CUDA graphs).

A decode step is a stream of small kernels, a few dozen per layer; at a small batch each runs
for microseconds, so the step is bound by launching them (and by the host's reads of device
values, ``bench/host_syncs.py``) unless the device is busy for most of the step's wall time. A CUDA
graph replays the launches without the host; what it could save is roughly wall - busy.

The demo checkpoint in bf16 (its few layers: the launches per layer times V4-Flash's 43 layers
give the full model's count), prompts prefilled, then ``--steps`` decode steps timed (wall: each
step synchronised) and the same steps again under torch.profiler: kernels on the device (CUDA),
their busy time (the union of their intervals), or on a CPU the top-level torch ops per step.
``--graphs`` (triton backend) then times as many steps replayed from CUDA graphs
(``model.graphs.DecodeGraphs``; on a CPU, the forward re-run on the captured plan) beside them.
``--device cuda`` without a GPU: a message, exit 0.
Run: ``python bench/decode_launches.py [--device cuda] [--backend triton] [--batch 1,32]
[--steps 20] [--prompt-tokens 300] [--top 12] [--graphs]``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from host_syncs import prefilled_demo
from options import bench_parser, need_cuda
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from dayzero.model import forward
from dayzero.model.graphs import DecodeGraphs

FLASH_LAYERS = 43


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (us)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def measure(batch: int, args: argparse.Namespace) -> dict:
    steps = (3 if args.graphs else 2) * (args.steps + 2)  # room for: eager timed, profiled, replayed (--graphs)
    model, pools, ids, tokens, options = prefilled_demo(
        batch, args.prompt_tokens, steps, args.backend, device=args.device
    )
    cuda = args.device.startswith("cuda")

    def step(tokens: list[int]) -> list[int]:
        return forward.decode(model, pools, ids, tokens, options).argmax(-1).tolist()  # the loop's read

    wall_ms, tokens = _median_wall_ms(step, tokens, args.steps, cuda)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            tokens = step(tokens)
        if cuda:
            torch.cuda.synchronize()
    graph_ms = None
    if args.graphs:
        graphs = DecodeGraphs(model, pools, options)
        graph_ms, tokens = _median_wall_ms(
            lambda t: graphs.decode(ids, t).argmax(-1).tolist(), tokens, args.steps, cuda
        )
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    top_ops = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::") and not _in_aten(e)]
    launched = kernels if cuda else top_ops
    return {
        "layers": len(model.layers),
        "wall_ms": wall_ms,
        "graph_ms": graph_ms,
        "busy_ms": _busy_us([(e.time_range.start, e.time_range.end) for e in kernels]) / args.steps / 1e3,
        "launches": len(launched) / args.steps,
        "by_name": collections.Counter(e.name for e in launched),
    }


def _median_wall_ms(step, tokens: list[int], steps: int, cuda: bool) -> tuple[float, list[int]]:
    """The median wall time of ``steps`` decode steps (each synchronised) after two untimed ones
    (first calls: Triton compiles, caches, a bucket's capture); and the tokens they end on."""
    walls = []
    for i in range(steps + 2):
        start = time.perf_counter()
        tokens = step(tokens)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            walls.append(time.perf_counter() - start)
    return statistics.median(walls) * 1e3, tokens


def _in_aten(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", choices=("torch", "triton"), default="torch")
    parser.add_argument("--batch", default="1,32", help="sequences a step, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--top", type=int, default=12, help="list the most frequent launches")
    parser.add_argument("--graphs", action="store_true", help="also time steps replayed from CUDA graphs (triton)")
    args = parser.parse_args()
    if args.graphs and args.backend != "triton":
        parser.error("--graphs replays the triton backend's steps: add --backend triton")
    cuda = args.device.startswith("cuda")
    if cuda:
        need_cuda(f"bench/decode_launches.py --device {args.device}")
    rows = {int(b): measure(int(b), args) for b in args.batch.split(",")}
    layers = next(iter(rows.values()))["layers"]
    what = "kernels" if cuda else "top-level torch ops"
    print(f"decode step, demo checkpoint ({layers} layers) in bf16 on {args.device}, backend {args.backend}, ")
    print(f"~{args.prompt_tokens}-token prompts, median of {args.steps} steps; launches: {what}")
    graphs = "| graph wall ms | eager / graph " if args.graphs else ""
    print(
        f"| batch | wall ms | device busy ms | busy / wall | launches | per layer | at {FLASH_LAYERS} layers {graphs}|"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * args.graphs)
    for batch, r in rows.items():
        busy = f"{r['busy_ms']:.3f} | {r['busy_ms'] / r['wall_ms']:.2f}" if cuda else "- | -"
        per_layer = r["launches"] / layers
        replayed = f" {r['graph_ms']:.3f} | {r['wall_ms'] / r['graph_ms']:.2f}x |" if args.graphs else ""
        print(
            f"| {batch} | {r['wall_ms']:.3f} | {busy} | {r['launches']:.0f} | {per_layer:.1f} | "
            f"{per_layer * FLASH_LAYERS:.0f} |{replayed}"
        )
    for batch, r in rows.items():
        print(f"\nthe most frequent {what} at batch {batch}, per step")
        print("| name | per step |\n|---|---:|")
        for name, n in r["by_name"].most_common(args.top):
            print(f"| {name[:90]} | {n / args.steps:g} |")


if __name__ == "__main__":
    main()
