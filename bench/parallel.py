"""Tensor + expert parallel on CPU over gloo: per-rank bytes, collectives, decode step time.

An FP4-expert / FP8-dense checkpoint (bench/moe.py's shape, 64 experts) on N = 1 and 2 local
ranks (rank 0 here, rank 1 spawned, each with its share of the CPU threads): resident bytes
of rank 0's model (experts and the rest), collectives per layer per decode step (counted by
dayzero.parallel.Group), and the median decode step (after an untimed first) with the part of it spent inside
collectives, and what a worker group adds to each step: rank 0 broadcasting the step's plan
(dayzero.serving.ranks). Gloo on a shared 2-core machine is slow: the collective share is the
figure to watch. One rank is timed with all the threads and with one (a rank of two gets one;
one row where torch has one thread).
``--layers`` and ``--experts`` size the model (bench/moe.py's ``sized``).
Run: ``python bench/parallel.py [--batch 4] [--prompt-tokens 64] [--steps 24] [--layers 4] [--experts 64]``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from moe import CONFIG, sized
from options import bench_parser

from dayzero.checkpoint import load_model
from dayzero.demo import write_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill
from dayzero.parallel.group import run_group
from dayzero.parallel.wire import Message, receive, send
from dayzero.quant.quantize import quantize_checkpoint
from dayzero.serving.ranks import Op


def rank_run(group, path: Path, batch: int, prompt: int, decode_steps: int) -> dict:
    model = load_model(path, progress=False, group=group)
    state = model.state_dict().items()
    experts = sum(t.numel() * t.element_size() for n, t in state if ".ffn.experts." in n)
    total = sum(t.numel() * t.element_size() for _, t in state)
    seqs = [f"s{i}" for i in range(batch)]
    pools = pools_for(model.cfg, torch.float32, prompt + decode_steps + 3, max_sequences=batch)
    prompts = [[(7 * i + j) % model.cfg.vocab_size for j in range(prompt)] for i in range(batch)]
    tokens = prefill(model, pools, seqs, prompts).argmax(-1).tolist()
    tokens = decode(model, pools, seqs, tokens).argmax(-1).tolist()  # untimed: the process's first decode's cost
    steps, comm = [], []
    counts_before = sum(group.counts.values())
    for _ in range(decode_steps):
        start, spent = time.perf_counter(), group.seconds
        tokens = decode(model, pools, seqs, tokens).argmax(-1).tolist()
        steps.append(time.perf_counter() - start)
        comm.append(group.seconds - spent)
    per_step = (sum(group.counts.values()) - counts_before) / decode_steps
    plans = []  # what a worker group adds per step: rank 0 sends the step's plan (ids, tokens)
    for _ in range(decode_steps):
        start = time.perf_counter()
        if group.config.rank == 0:
            send(group, Message(Op.DECODE, tokens, seqs))
        else:
            receive(group)
        plans.append(time.perf_counter() - start)
    return {
        "plan_ms": statistics.median(plans) * 1e3,
        "experts": experts,
        "other": total - experts,
        "collectives_per_step": per_step,
        "per_layer": per_step / model.cfg.num_layers,
        "step_ms": statistics.median(steps) * 1e3,
        "comm_ms": statistics.median(comm) * 1e3,
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--batch", type=int, default=4, help="sequences a decode step")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed (their median)")
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"], help="2 or more")
    parser.add_argument("--experts", type=int, default=CONFIG["n_routed_experts"], help="a multiple of the ranks (2)")
    args = parser.parse_args()
    sizes = (args.batch, args.prompt_tokens, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_checkpoint(Path(tmp) / "src", sized(max(2, args.layers), args.experts), seed=0)
        path = quantize_checkpoint(src, Path(tmp) / "fp4", progress=False)
        print(
            f"decode: batch {args.batch}, {args.prompt_tokens}-token prompts, median of {args.steps} steps;"
            " bytes of rank 0"
        )
        print(
            "| ranks | experts MiB | other MiB | collectives / step (/ layer) | step ms | collectives ms (share) "
            "| plan broadcast ms |"
        )
        print("|---|---|---|---|---|---|---|")
        threads = torch.get_num_threads()
        runs = [(1, threads, f"1 ({threads} threads)"), (1, 1, "1 (1 thread)"), (2, 1, "2 (1 thread each)")]
        for n, rank_threads, label in runs[1:] if threads == 1 else runs:  # (one thread: the first two repeat)
            torch.set_num_threads(rank_threads)
            r = run_group(n, rank_run, path, *sizes)  # two ranks: run_group gives each its share of the threads
            share = r["comm_ms"] / r["step_ms"]
            print(
                f"| {label} | {r['experts'] / 2**20:.2f} | {r['other'] / 2**20:.2f} | {r['collectives_per_step']:.0f} "
                f"({r['per_layer']:.2f}) | {r['step_ms']:.1f} | {r['comm_ms']:.1f} ({share:.0%}) | {r['plan_ms']:.2f} |"
            )


if __name__ == "__main__":
    main()
