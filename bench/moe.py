"""MoE with FP4 experts: online conversion (+ cache) vs experts pre-converted to bf16.

1. One MoE layer's time for a decode batch and a prefill chunk: experts packed (dequantized
   per call into the workspace; with a warm cache) vs experts held in bf16. Median of runs.
2. Load time and resident expert memory of an FP4 checkpoint: kept packed vs dequantized to
   bf16 at load. ``--layers`` and ``--experts`` size the model (``CONFIG``: 4 x 64).
Run: ``python bench/moe.py [--tokens 16 512] [--runs 7] [--layers 4] [--experts 64]``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from options import bench_parser
from timing import median_seconds

from dayzero.checkpoint import load_model
from dayzero.demo import write_checkpoint
from dayzero.model.moe import moe
from dayzero.quant.quantize import quantize_checkpoint

CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 512,
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 64,
    "partial_rotary_factor": 0.25,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 128,
    "sliding_window": 64,
    "index_n_heads": 8,
    "index_head_dim": 32,
    "index_topk": 8,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    "hc_mult": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 512,
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
}


def sized(layers: int, experts: int) -> dict:
    """``CONFIG`` with ``layers`` layers (2 or more; its layer kinds repeated) of ``experts`` experts."""
    kinds = CONFIG["layer_types"][1:]
    return {
        **CONFIG,
        "num_hidden_layers": layers,
        "n_routed_experts": experts,
        "num_experts_per_tok": min(CONFIG["num_experts_per_tok"], experts),
        "layer_types": CONFIG["layer_types"][:1] + [kinds[i % len(kinds)] for i in range(layers - 1)],
        "mlp_layer_types": ["hash_moe"] + ["moe"] * (layers - 1),
    }


def expert_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for b in model.layers for t in b.ffn.experts.buffers()) + sum(
        p.numel() * p.element_size() for b in model.layers for p in b.ffn.experts.parameters()
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 512], help="tokens of a MoE call (a batch)")
    parser.add_argument("--runs", type=int, default=7, help="runs per median")
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"], help="2 or more")
    parser.add_argument("--experts", type=int, default=CONFIG["n_routed_experts"])
    args = parser.parse_args()
    config = sized(max(2, args.layers), args.experts)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_checkpoint(Path(tmp) / "float", config)
        fp4 = quantize_checkpoint(src, Path(tmp) / "fp4", progress=False)
        start = time.perf_counter()
        packed = load_model(fp4, torch.bfloat16, progress=False, expert_cache_bytes=0)
        packed_load = time.perf_counter() - start
        start = time.perf_counter()
        converted = load_model(fp4, torch.bfloat16, progress=False, expert_cache_bytes=0)
        for block in converted.layers:  # convert everything at load, as a non-packed server would
            experts = block.ffn.experts
            experts.converter.weights(experts, list(range(config["n_routed_experts"])))
        full_load = time.perf_counter() - start
        full_bytes = config["num_hidden_layers"] * config["n_routed_experts"] * 3 * 512 * 512 * 2
        cached = load_model(fp4, torch.bfloat16, progress=False, expert_cache_bytes=1 << 30)
        float_model = load_model(src, torch.bfloat16, progress=False)
    cfg, layer = packed.cfg, 1
    experts, top = config["n_routed_experts"], config["num_experts_per_tok"]
    print(f"1. one MoE layer (hidden 512, {experts} experts of 512, top-{top}), bf16 CPU, median of {args.runs}")
    print("| tokens | bf16 experts ms | FP4 online ms | FP4 + warm cache ms | online / bf16 | cached / bf16 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for tokens in args.tokens:
        x = torch.randn(tokens, 512, dtype=torch.bfloat16)
        ids = torch.randint(2, 512, (tokens,))
        base, online, warm = (
            median_seconds(
                lambda m=m, x=x, ids=ids: moe(m.layers[layer].ffn, cfg, x, ids, "torch", m.comm), runs=args.runs
            )
            * 1e3
            for m in (float_model, packed, cached)
        )
        print(f"| {tokens} | {base:.2f} | {online:.2f} | {warm:.2f} | {online / base:.2f}x | {warm / base:.2f}x |")
    c = packed.expert_converter.counters
    print(f"counters (online model): {c.as_dict()}")
    print(f"\n2. load and resident expert memory, {config['num_hidden_layers']} layers x {experts} experts")
    print("| experts | load s | resident expert MiB |")
    print("|---|---:|---:|")
    print(f"| FP4 packed | {packed_load:.2f} | {expert_bytes(packed) / 2**20:.1f} |")
    print(f"| converted to bf16 at load | {full_load:.2f} | {full_bytes / 2**20:.1f} |")
    print(f"packed / bf16 resident: {expert_bytes(packed) / full_bytes:.3f}x")


if __name__ == "__main__":
    main()
