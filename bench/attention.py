"""Attention cost vs context: sparse runtime vs dense, and prefill time / peak memory.

1. Decode-step attention of one CSA layer (window 128, rate 4, top-k 512; tiny heads and
   DeepSeek-V4-Flash's 64 x 512 with a 64 x 128 indexer) for contexts 1k-64k: dayzero's
   indexer + sparse attention (torch backend, CPU) vs dense attention over all raw tokens.
   Median of several runs.
2. Attention-state bytes per token for DeepSeek-V4-Flash (bf16) vs a dense bf16 KV cache.
3. Prefill time and peak RSS, dayzero vs transformers, on a tiny checkpoint, 1k-32k tokens;
   each run in its own process with a 12 GiB address-space cap, so that transformers'
   quadratic prefill fails cleanly where it stops fitting.
``--device cuda`` without a GPU: a message, exit 0.
Writes bench/attention.png. Run: ``python bench/attention.py [--quick] [--parts decode,state,prefill]
[--contexts 4096,65536] [--dtype bfloat16] [--device cuda --backend triton] [--batch 32] [--lengths 8192,32768]
[--no-reference]``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from attention_prefill import prefill_table
from options import bench_parser, need_cuda
from timing import median_seconds

from dayzero.config import ModelConfig
from dayzero.kernels import CompressedKeys, RaggedBatch, indexer_topk, sparse_attention_decode
from dayzero.kv.layout import GROWING_POOLS, PoolLayout

WINDOW, RATE, TOPK, BS = 128, 4, 512, 64


@dataclass(frozen=True, slots=True)
class Heads:
    name: str
    heads: int
    dim: int
    index_heads: int
    index_dim: int


TINY = Heads("tiny", 16, 64, 8, 32)
FLASH = Heads("V4-Flash", 64, 512, 64, 128)  # DeepSeek-V4-Flash's attention and indexer heads


@dataclass(frozen=True, slots=True)
class Setup:
    """How the decode step runs: ``device``, the kernels' backend (triton: compiled on a GPU), and
    how many sequences share the step (each at the same context, its own blocks)."""

    device: str = "cpu"
    backend: str = "torch"
    batch: int = 1

    def median_ms(self, fn, runs: int) -> float:
        def call() -> None:
            fn()
            if self.device == "cuda":
                torch.cuda.synchronize()

        return median_seconds(call, runs) * 1e3


def decode_step(shape: Heads, context: int, runs: int, dtype: torch.dtype, at: Setup) -> tuple[float, float, float]:
    """(sparse total ms, of which indexer ms, dense ms) for ``at.batch`` queries at position
    ``context - 1``, activations and every cache in ``dtype`` (the softmax in fp32 on both sides)."""
    gen = torch.Generator(at.device).manual_seed(0)
    b, entries = at.batch, context // RATE
    n_blocks = -(-entries // BS)
    batch = RaggedBatch.build([context - 1] * b, [1] * b, at.device)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=at.device).to(dtype)

    def tables(per_seq: int) -> torch.Tensor:  # each sequence its own blocks
        return torch.arange(b * per_seq, dtype=torch.int32, device=at.device).view(b, per_seq)

    q, kv = randn(b, shape.heads, shape.dim), randn(b, shape.dim)
    window, window_table = randn(2 * b, BS, shape.dim), tables(2)  # a ring of 2 blocks: the 128-token window
    pool, keys = randn(b * n_blocks, BS, shape.dim), randn(b * n_blocks, BS, shape.index_dim)
    table = tables(n_blocks)
    iq, iw = randn(b, shape.index_heads, shape.index_dim), randn(b, shape.index_heads)
    visible = torch.full((b,), entries, dtype=torch.int32, device=at.device)
    sink = torch.zeros(shape.heads, device=at.device)
    raw = randn(b, context, shape.dim)
    backend = at.backend

    def index():
        return indexer_topk(iq, iw, batch, keys, table, visible, TOPK, backend=backend)

    picked = index()

    def sparse():
        chosen = index()
        keys_of = CompressedKeys(pool, table, indices=chosen)
        return sparse_attention_decode(q, kv, batch, window, window_table, WINDOW, sink, keys_of, backend=backend)

    def dense():
        probs = (q @ raw.transpose(1, 2)).float().mul_(shape.dim**-0.5).softmax(dim=-1)
        return probs.to(dtype) @ raw

    assert picked.shape == (b, TOPK)
    return at.median_ms(sparse, runs), at.median_ms(index, runs), at.median_ms(dense, runs)


def work_ratio(shape: Heads, context: int) -> float:
    """Multiply-adds of dense attention over ``context`` tokens / those of the sparse step (the
    indexer's scores and head sum over context / RATE entries, attention over window + top-k):
    the speed-up at equal arithmetic rate."""
    dense = 2 * shape.heads * shape.dim * context  # q . k, then probs . v
    entries = context // RATE
    indexer = shape.index_heads * (shape.index_dim + 1) * entries
    sparse = indexer + 2 * shape.heads * shape.dim * (WINDOW + min(TOPK, entries))
    return dense / sparse


def decode_table(
    shape: Heads, contexts: list[int], runs: int, dtype: torch.dtype, at: Setup
) -> list[tuple[int, float, float, float]]:
    where = torch.cuda.get_device_name() if at.device == "cuda" else "CPU"
    print(
        f"1. decode-step attention, one CSA layer, {shape.name} heads (H={shape.heads}, D={shape.dim}, "
        f"indexer {shape.index_heads} x {shape.index_dim}, window {WINDOW}, rate {RATE}, top-k {TOPK}), "
        f"{where} {str(dtype)[6:]}, {at.backend} kernels, {at.batch} sequence(s) a step, median of {runs}; "
        "work = dense / sparse multiply-adds (the ratio at equal FLOP/s)"
    )
    print("| context | sparse ms | (indexer ms) | dense ms | dense / sparse | work |")
    print("|--------:|----------:|-------------:|---------:|---------------:|-----:|")
    rows = []
    for ctx in contexts:
        sparse_ms, index_ms, dense_ms = decode_step(shape, ctx, runs, dtype, at)
        rows.append((ctx, sparse_ms, index_ms, dense_ms))
        ratio, work = dense_ms / sparse_ms, work_ratio(shape, ctx)
        print(f"| {ctx:7d} | {sparse_ms:9.3f} | {index_ms:12.3f} | {dense_ms:8.3f} | {ratio:13.2f}x | {work:4.1f}x |")
    print()
    return rows


def state_bytes_per_token() -> tuple[float, float]:
    """(dayzero, dense bf16) attention-state bytes per token, DeepSeek-V4-Flash, all layers."""
    cfg = ModelConfig.from_dict({"model_type": "deepseek_v4"})
    layout = PoolLayout.of(cfg, 64, "bfloat16")
    ours = sum(layout.row_bytes(p, 2) / layout.rate(p) for p in GROWING_POOLS)
    dense = cfg.num_layers * cfg.head_dim * 2  # one shared K=V head per layer, bf16
    return ours, dense


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and runs")
    parser.add_argument("--plot", default=str(Path(__file__).with_name("attention.png")))
    parser.add_argument("--parts", default="decode,state,prefill", help="which of the three to run")
    parser.add_argument("--contexts", help="decode contexts, comma-separated")
    parser.add_argument("--lengths", help="prefill prompt lengths, comma-separated")
    parser.add_argument("--dtype", default="float32", help="decode: activations' and caches' type (bfloat16 as served)")
    parser.add_argument("--no-reference", action="store_true", help="prefill without transformers")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="decode: where it runs")
    parser.add_argument("--backend", choices=("torch", "triton"), default="torch", help="decode: the kernels")
    parser.add_argument("--batch", type=int, default=1, help="decode: sequences a step (each at the context)")
    args = parser.parse_args()
    if args.device == "cuda":
        need_cuda("bench/attention.py --device cuda")
    if args.backend == "triton" and args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("the triton backend runs on --device cuda (or interpreted: TRITON_INTERPRET=1)")
    parts = args.parts.split(",")
    runs = 3 if args.quick else 7
    contexts = [1024, 4096, 16384] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    contexts = [int(n) for n in args.contexts.split(",")] if args.contexts else contexts
    dtype = getattr(torch, args.dtype)
    at = Setup(args.device, args.backend, args.batch)
    decode_rows = decode_table(TINY, contexts, runs, dtype, at) if "decode" in parts else []
    if "decode" in parts:
        decode_table(FLASH, contexts, runs, dtype, at)
    if "state" in parts:
        ours, dense = state_bytes_per_token()
        print(
            f"2. attention state per token, DeepSeek-V4-Flash bf16, 43 layers: dayzero {ours:.0f} B "
            f"(compressed entries + indexer keys; plus a fixed {WINDOW}-token window per layer) vs dense "
            f"K=V cache {dense:.0f} B -> {dense / ours:.1f}x smaller"
        )
    if "prefill" in parts:
        lengths = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
        lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else lengths
        prefill_rows = prefill_table(lengths, not args.no_reference)
        if decode_rows:
            plot(args.plot, decode_rows, prefill_rows)
            print(f"\nplot: {args.plot}")


def plot(path: str, decode_rows: list, prefill_rows: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ctx = [r[0] for r in decode_rows]
    left.plot(ctx, [r[1] for r in decode_rows], "o-", label="dayzero sparse (indexer + attention)")
    left.plot(ctx, [r[2] for r in decode_rows], "o--", label="  of which indexer")
    left.plot(ctx, [r[3] for r in decode_rows], "s-", label="dense attention")
    left.set(xlabel="context tokens", ylabel="ms per decode step", title="decode-step attention, one CSA layer")
    for name, idx, marker in (("dayzero", 1, "o-"), ("transformers", 2, "s-")):
        pts = [(r[0], r[idx]["peak_mib"]) for r in prefill_rows if "error" not in r[idx]]
        if pts:
            right.plot(*zip(*pts, strict=True), marker, label=f"{name} peak MiB")
    right.set(xlabel="prompt tokens", ylabel="peak RSS increase (MiB)", title="prefill memory, tiny model")
    for side in (left, right):
        side.set(xscale="log", yscale="log")
        side.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
