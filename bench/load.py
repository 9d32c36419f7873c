"""Peak host memory while loading a sharded checkpoint in the release's layout, against the model's bytes.

    python bench/load.py [--shards 4] [--runs 3]

Writes a random FP4-expert / FP8-dense checkpoint (E8M0 scales, ``--shards`` files with an
index, an MTP layer) once, then loads it in fresh processes: each reports its resident set
after imports, its peak during ``load_model`` (VmHWM) and the bytes of the loaded model, and the
seconds of its first load (the tiny demo checkpoint: what a starting worker pays) and of this one.
The figure to watch: (peak - baseline) / model bytes, i.e. what loading costs above the model.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from options import bench_parser

CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 4096,
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "head_dim": 128,
    "q_lora_rank": 256,
    "o_groups": 2,
    "o_lora_rank": 128,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    + ["compressed_sparse_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "index_n_heads": 8,
    "index_head_dim": 64,
    "index_topk": 16,
    "hc_mult": 4,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
}


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _high_water_bytes() -> int:
    """VmHWM: this process image's peak resident set (ru_maxrss would carry the parent's peak over exec)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def measure(path: str, warmup: str) -> dict:
    """In this (fresh) process: baseline after imports and a warm-up load of a tiny checkpoint
    (torch imports triton and sympy lazily on first use: ~150 MiB that is not loading's cost),
    peak while loading, model bytes."""
    import gc

    import torch

    from dayzero.checkpoint import load_model

    start = time.perf_counter()
    load_model(warmup, progress=False)
    first_s = time.perf_counter() - start
    gc.collect()
    baseline = _rss_bytes()
    start = time.perf_counter()
    model = load_model(path, progress=False)
    load_s = time.perf_counter() - start
    peak = _high_water_bytes()
    model_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    del torch
    return {"baseline": baseline, "peak": peak, "model": model_bytes, "first_s": first_s, "load_s": load_s}


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    from dayzero.demo import add_mtp, write_checkpoint, write_demo_checkpoint
    from dayzero.quant.quantize import quantize_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        src = write_checkpoint(Path(tmp) / "src", CONFIG, seed=0)
        add_mtp(src, seed=0)
        out = quantize_checkpoint(src, Path(tmp) / "release", progress=False, shards=args.shards)
        on_disk = sum(f.stat().st_size for f in out.glob("*.safetensors"))
        warmup = write_demo_checkpoint(Path(tmp) / "tiny", fp4=True)
        runs = []
        for _ in range(args.runs):
            done = subprocess.run(
                [sys.executable, __file__, "--measure", str(out), str(warmup)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    mib = 1 << 20
    model = runs[0]["model"]
    above = statistics.median(r["peak"] - r["baseline"] for r in runs)
    first, load = (statistics.median(r[k] for r in runs) for k in ("first_s", "load_s"))
    print(f"medians of {args.runs}; first load: the tiny demo checkpoint, the process's first (a worker's start)")
    print("| shards | on disk MiB | model MiB | peak above baseline MiB | ratio | first load s | load s |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.shards} | {on_disk / mib:.1f} | {model / mib:.1f} | {above / mib:.1f} | {above / model:.2f}x "
        f"| {first:.2f} | {load:.2f} |"
    )


if __name__ == "__main__":
    main()
