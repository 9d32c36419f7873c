"""Each compiled Triton kernel against its torch twin, side by side on one GPU, at DeepSeek-V4-Flash
layer shapes (64 heads x 512, window 128, CSA rate 4, top-k 512, 64 indexer heads x 128, 4
hyper-connection streams of 4096 with 20 Sinkhorn passes, MoE 4096 -> 2 x 2048 with 256 FP4
experts, 6 per token, RMS norms of the hidden 4096 and of the 4 x 4096 streams).

Each row: the twin's and the kernel's median time (CUDA-synchronised, several runs) on the same
inputs, their ratio, and the largest difference between the two outputs (a wrong kernel shows
here too). ``--smoke`` runs tiny shapes anywhere (CPU with TRITON_INTERPRET=1) to check the
script itself. Run on a GPU host: ``python bench/kernels.py`` (bench/gpu.sh does); without a GPU it
says so and exits 0 (bench/options.py's ``need_cuda``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from options import bench_parser, need_cuda
from timing import median_seconds

from dayzero.kernels import CompressedKeys, RaggedBatch, indexer_topk, sparse_attention_decode, sparse_attention_prefill
from dayzero.kernels.hyper import hyper_merge, hyper_mix
from dayzero.kernels.moe import grouped_mxfp4_matmul, swiglu
from dayzero.kernels.norms import rms_norm, rms_scale
from dayzero.kernels.rope import rotate

FLASH = dict(heads=64, dim=512, window=128, rate=4, topk=512, index_heads=64, index_dim=128, block=64)
FLASH_MOE = dict(hidden=4096, inter=2048, experts=256, per_token=6)
SMOKE = dict(heads=4, dim=16, window=8, rate=4, topk=8, index_heads=4, index_dim=8, block=4)
SMOKE_MOE = dict(hidden=64, inter=32, experts=8, per_token=2)


class Inputs:
    """Random tensors of one shape family on one device (pools in ``dtype``, queries too)."""

    def __init__(self, shape: dict, device: str, dtype: torch.dtype) -> None:
        self.s, self.device, self.dtype = shape, device, dtype
        self.gen = torch.Generator().manual_seed(0)

    def randn(self, *size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*size, generator=self.gen).to(self.device, dtype or self.dtype)

    def pool(self, seqs: int, entries: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A block pool holding ``entries`` rows per sequence, its blocks shuffled, and the tables."""
        per_seq = -(-entries // self.s["block"])
        blocks = torch.randperm(seqs * per_seq, generator=self.gen).to(torch.int32).view(seqs, per_seq)
        return self.randn(seqs * per_seq, self.s["block"], width), blocks.to(self.device)

    def attention(self, starts: list[int], news: list[int]) -> tuple:
        s, seqs, t = self.s, len(starts), sum(news)
        batch = RaggedBatch.build(starts, news, self.device)
        window, window_table = self.pool(seqs, s["window"], s["dim"])
        pool, table = self.pool(seqs, max(starts) // s["rate"] + max(news), s["dim"])
        visible = torch.div(batch.positions + 1, s["rate"], rounding_mode="floor").cpu()
        picks = torch.stack([torch.randperm(max(int(v), s["topk"]), generator=self.gen)[: s["topk"]] for v in visible])
        picks = torch.where(picks < visible[:, None], picks, -1).to(torch.int32).to(self.device)
        keys = CompressedKeys(pool, table, indices=picks)
        q, kv, sink = self.randn(t, s["heads"], s["dim"]), self.randn(t, s["dim"]), self.randn(s["heads"])
        return q, kv, batch, window, window_table, s["window"], sink, keys

    def indexer(self, starts: list[int], news: list[int]) -> tuple:
        s, t = self.s, sum(news)
        batch = RaggedBatch.build(starts, news, self.device)
        keys, table = self.pool(len(starts), max(starts) // s["rate"] + max(news), s["index_dim"])
        visible = torch.div(batch.positions + 1, s["rate"], rounding_mode="floor").to(torch.int32)
        q, w = self.randn(t, s["index_heads"], s["index_dim"]), self.randn(t, s["index_heads"])
        return q, w, batch, keys, table, visible, s["topk"]

    def hyper(self, tokens: int, hidden: int, n: int = 4, iters: int = 20) -> tuple:
        width = (2 + n) * n
        mixes, base = self.randn(tokens, width, dtype=torch.float32), self.randn(width, dtype=torch.float32)
        scale = self.randn(3, dtype=torch.float32).abs()
        return mixes, base, scale, self.randn(tokens, n, hidden), iters, 1e-6


def moe_inputs(shape: dict, tokens: int, device: str) -> tuple:
    """Gate+up projection of ``tokens`` routed to ``per_token`` random experts each; the experts
    are random FP4 codes with scales around 2^0 (quantizing 2 GiB of weights would take minutes)."""
    gen = torch.Generator(device).manual_seed(1)
    experts, n, k = shape["experts"], 2 * shape["inter"], shape["hidden"]
    packed = torch.randint(0, 256, (experts, n, k // 2), generator=gen, device=device, dtype=torch.uint8)
    scales = torch.randint(124, 130, (experts, n, k // 32), generator=gen, device=device, dtype=torch.uint8)
    routed = torch.rand(tokens, experts, generator=gen, device=device).argsort(dim=1)[:, : shape["per_token"]]
    counts = torch.bincount(routed.flatten(), minlength=experts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    x = torch.randn(int(counts.sum()), k, generator=gen, device=device)
    return x, packed, scales, offsets, tokens  # an expert takes a token once: at most ``tokens`` rows


def compare(name: str, run: Callable[[str], torch.Tensor], runs: int, device: str) -> dict:
    def timed(backend: str) -> float:
        def call() -> None:
            run(backend)
            if device.startswith("cuda"):
                torch.cuda.synchronize()

        return median_seconds(call, runs) * 1e3

    want, got = run("torch"), run("triton")
    if want.dtype in (torch.int32, torch.int64):  # top-k ids: compare the selected sets
        diff = float(sum(set(a.tolist()) != set(b.tolist()) for a, b in zip(want, got, strict=True)))
    else:
        diff = (got.float() - want.float()).abs().max().item()
    twin_ms, kernel_ms = timed("torch"), timed("triton")
    return {"case": name, "twin_ms": twin_ms, "kernel_ms": kernel_ms, "speedup": twin_ms / kernel_ms, "diff": diff}


def cases(
    shape: dict, moe_shape: dict, sizes: tuple[int, int, int], device: str, dtype: torch.dtype
) -> list[tuple[str, Callable[[str], torch.Tensor]]]:
    """(name, run(backend)) per kernel at one shape family; ``sizes``: context, decode batch, prefill chunk."""
    make = Inputs(shape, device, dtype)
    ctx, batch, chunk = sizes
    decode_args = make.attention([ctx - 1] * batch, [1] * batch)
    prefill_args = make.attention([ctx - chunk], [chunk])
    index_decode = make.indexer([4 * ctx - 1] * batch, [1] * batch)
    index_prefill = make.indexer([ctx - chunk], [chunk])
    moe_decode, moe_prefill = moe_inputs(moe_shape, batch, device), moe_inputs(moe_shape, chunk // 4, device)
    hyper_decode, hyper_prefill = make.hyper(batch, moe_shape["hidden"]), make.hyper(chunk, moe_shape["hidden"])
    hidden, norm = make.randn(batch, moe_shape["hidden"]), make.randn(moe_shape["hidden"], dtype=torch.float32)
    streams = make.randn(batch, 4 * moe_shape["hidden"], dtype=torch.float32)  # the mix's input: fp32
    post, comb = make.randn(batch, 4, dtype=torch.float32), make.randn(batch, 4, 4, dtype=torch.float32)
    merge_args = (streams.view(batch, 4, -1).to(dtype), hidden, post, comb)
    gate, up = make.randn(batch, moe_shape["inter"]), make.randn(batch, moe_shape["inter"])  # the shared expert's
    queries, half = make.randn(batch, shape["heads"], shape["dim"]), shape["dim"] // 16  # V4: RoPE on 64 of 512
    rotation = torch.polar(torch.ones(batch, half), make.randn(batch, half, dtype=torch.float32).cpu()).to(device)
    return [
        (f"decode attention, {batch} seqs @ {ctx}", lambda b: sparse_attention_decode(*decode_args, backend=b)),
        (f"prefill attention, {chunk} tok @ {ctx}", lambda b: sparse_attention_prefill(*prefill_args, backend=b)),
        (f"indexer top-k, {batch} seqs @ {4 * ctx}", lambda b: indexer_topk(*index_decode, backend=b)),
        (f"indexer top-k, {chunk} tok @ {ctx}", lambda b: indexer_topk(*index_prefill, backend=b)),
        (f"hyper-connection mix, {batch} tok", lambda b: hyper_mix(*hyper_decode, backend=b)[0]),
        (f"hyper-connection mix, {chunk} tok", lambda b: hyper_mix(*hyper_prefill, backend=b)[0]),
        (f"MXFP4 experts, {batch} tok", lambda b: grouped_mxfp4_matmul(*moe_decode, backend=b)),
        (f"MXFP4 experts, {chunk // 4} tok", lambda b: grouped_mxfp4_matmul(*moe_prefill, backend=b)),
        (f"hyper-connection merge, {batch} tok", lambda b: hyper_merge(*merge_args, backend=b)),
        (f"RoPE of the queries, {batch} tok", lambda b: rotate(queries, rotation, b)),
        (f"SwiGLU of the shared expert, {batch} tok", lambda b: swiglu(gate, up, 10.0, b)),
        (f"RMS norm, {batch} tok", lambda b: rms_norm(hidden, norm, 1e-6, b)),
        (f"RMS scale of the streams, {batch} tok", lambda b: rms_scale(streams, 1e-6, b)),
    ]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: check the script (CPU: TRITON_INTERPRET=1)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per median (default 7)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="pools and queries")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.smoke:
        need_cuda("bench/kernels.py (--smoke: tiny shapes, on a CPU too)")
    dtype = getattr(torch, args.dtype)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (interpreted)"
    print(f"compiled Triton kernels vs torch twins, {where}, {args.dtype}, median of {args.runs}")
    print("| case | twin ms | kernel ms | twin / kernel | max diff |")
    print("|------|--------:|----------:|--------------:|---------:|")
    shapes = (SMOKE, SMOKE_MOE, (64, 2, 8)) if args.smoke else (FLASH, FLASH_MOE, (16384, 32, 2048))
    # (a name twice is one configuration run twice: --smoke's MXFP4 rows, 2 tokens each, are one row)
    for name, run in dict(cases(*shapes, device, dtype)).items():
        row = compare(name, run, args.runs, device)
        times = f"{row['twin_ms']:.3f} | {row['kernel_ms']:.3f} | {row['speedup']:.2f}x"
        print(f"| {row['case']} | {times} | {row['diff']:.2e} |")
    print("max diff: largest |kernel - twin| (top-k rows: queries whose selected sets differ)")


if __name__ == "__main__":
    main()
