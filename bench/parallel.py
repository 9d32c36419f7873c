"""Tensor + expert parallel on CPU over gloo: per-rank bytes, collectives, decode step time.

An FP4-expert / FP8-dense checkpoint (bench/moe.py's shape, 64 experts) on N = 1 and 2 local
ranks (rank 0 here, rank 1 spawned, each with its share of the CPU threads): resident bytes
of rank 0's model (experts and the rest), collectives per layer per decode step (counted by
dayzero.parallel.Group), and the median decode step with the part of it spent inside
collectives, and what a worker group adds to each step: rank 0 broadcasting the step's plan
(dayzero.serving.ranks). Gloo on a shared 2-core machine is slow: the collective share is the
figure to watch. One rank is timed with all the threads and with one (a rank of two gets one).
Run: ``python bench/parallel.py``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from moe import CONFIG

from dayzero.checkpoint import load_model
from dayzero.demo import write_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill
from dayzero.parallel.group import run_group
from dayzero.parallel.wire import Message, receive, send
from dayzero.quant.quantize import quantize_checkpoint
from dayzero.serving.ranks import Op

PROMPT, STEPS, BATCH = 64, 24, 4


def rank_run(group, path: Path) -> dict:
    model = load_model(path, progress=False, group=group)
    state = model.state_dict().items()
    experts = sum(t.numel() * t.element_size() for n, t in state if ".ffn.experts." in n)
    total = sum(t.numel() * t.element_size() for _, t in state)
    seqs = [f"s{i}" for i in range(BATCH)]
    pools = pools_for(model.cfg, torch.float32, PROMPT + STEPS + 2, max_sequences=BATCH)
    prompts = [[(7 * i + j) % model.cfg.vocab_size for j in range(PROMPT)] for i in range(BATCH)]
    tokens = prefill(model, pools, seqs, prompts).argmax(-1).tolist()
    steps, comm = [], []
    counts_before = sum(group.counts.values())
    for _ in range(STEPS):
        start, spent = time.perf_counter(), group.seconds
        tokens = decode(model, pools, seqs, tokens).argmax(-1).tolist()
        steps.append(time.perf_counter() - start)
        comm.append(group.seconds - spent)
    per_step = (sum(group.counts.values()) - counts_before) / STEPS
    plans = []  # what a worker group adds per step: rank 0 sends the step's plan (ids, tokens)
    for _ in range(STEPS):
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
    with tempfile.TemporaryDirectory() as tmp:
        src = write_checkpoint(Path(tmp) / "src", CONFIG, seed=0)
        path = quantize_checkpoint(src, Path(tmp) / "fp4", progress=False)
        print(f"decode: batch {BATCH}, {PROMPT}-token prompts, median of {STEPS} steps; bytes of rank 0")
        print(
            "| ranks | experts MiB | other MiB | collectives / step (/ layer) | step ms | collectives ms (share) "
            "| plan broadcast ms |"
        )
        print("|---|---|---|---|---|---|---|")
        threads = torch.get_num_threads()
        for n, label in ((1, f"1 ({threads} threads)"), (1, "1 (1 thread)"), (2, "2 (1 thread each)")):
            torch.set_num_threads(threads if "threads" in label else 1)
            r = run_group(n, rank_run, path)  # two ranks: run_group gives each its share of the threads
            share = r["comm_ms"] / r["step_ms"]
            print(
                f"| {label} | {r['experts'] / 2**20:.2f} | {r['other'] / 2**20:.2f} | {r['collectives_per_step']:.0f} "
                f"({r['per_layer']:.2f}) | {r['step_ms']:.1f} | {r['comm_ms']:.1f} ({share:.0%}) | {r['plan_ms']:.2f} |"
            )


if __name__ == "__main__":
    main()
