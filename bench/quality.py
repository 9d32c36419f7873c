"""Held-out quality of the trained demo model, per engine and weight format; MTP's t+2 accuracy.

Perplexity on the held-out 5% of Python's reference manual (``dayzero.train.corpus``, seed 0),
in non-overlapping 256-token windows: transformers' ``DeepseekV4ForCausalLM`` (fp32) and dayzero
(torch backend) on the weights as shipped (FP4 experts, FP8 dense), on FP4 experts or FP8 dense
alone, in bf16, with CSA's sparse selection off; and on the float weights before the release's
formats when ``--float DIR`` (``dayzero train-demo OUT --float DIR``) is given. MTP rows: the
transformers-built MTP layer (``dayzero.train.model.MTP``) — how often its argmax is token t+2.

Run: ``python bench/quality.py [--checkpoint DIR] [--float DIR]``.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from options import bench_parser
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from dayzero.checkpoint import load_model
from dayzero.kv.pools import pools_for
from dayzero.model.forward import score
from dayzero.model.plan import AttentionOptions
from dayzero.quant.quantize import DENSE, EXPERT, quantization_config
from dayzero.settings import BUILT_IN_MODEL

LENGTH = 256


@torch.inference_mode()
def dayzero_loss(path: Path, rows: torch.Tensor, dtype: torch.dtype, options: AttentionOptions) -> float:
    """Mean next-token CE of dayzero over windows rows [W, L]."""
    model = load_model(path, dtype=dtype, progress=False)
    total = 0.0
    for i, ids in enumerate(rows.tolist()):
        pools = pools_for(model.cfg, dtype, len(ids))
        logits = score(model, pools, f"w{i}", ids, options)  # [L, V]
        total += F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:])).item()
    return total / rows.shape[0]


def mixed(float_dir: Path, shipped: Path, pattern, experts: str | None, out: Path) -> Path:
    """The float checkpoint with the shipped tensors (and scales) whose names match ``pattern``."""
    tensors = load_file(str(float_dir / "model.safetensors"))
    release = load_file(str(shipped / "model.safetensors"))
    for name in [k for k in tensors if pattern.match(k)]:
        base = name.removesuffix(".weight")
        tensors[name] = release[name]
        if f"{base}.scale" in release:
            tensors[f"{base}.scale"] = release[f"{base}.scale"]
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config(experts or "fp8")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def row(name: str, loss: float, top1: float | None = None) -> str:
    mtp = f"{top1:.3f}" if top1 is not None else "-"
    return f"| {name:<50} | {loss:8.4f} | {math.exp(loss):10.2f} | {mtp:>14} |"


def main() -> None:
    p = bench_parser(__doc__)
    p.add_argument("--checkpoint", type=Path, default=BUILT_IN_MODEL, help="the release-layout checkpoint")
    p.add_argument("--float", type=Path, dest="float_dir", help="the float weights (train-demo --float)")
    p.add_argument("--windows", type=int, help="only the first N windows (default: all)")
    args = p.parse_args()
    # (after --help: the training side imports transformers' model code, ~20 s on a loaded CPU)
    from dayzero.train.corpus import split
    from dayzero.train.data import windows
    from dayzero.train.export import load_reference
    from dayzero.train.loop import evaluate
    from dayzero.train.pipeline import held_out_stream

    stream = held_out_stream(Tokenizer.from_file(str(args.checkpoint / "tokenizer.json")), split(0))
    rows = windows(stream, LENGTH)[: args.windows]
    stream = rows.flatten()
    print(f"held-out: {rows.shape[0]} windows of {LENGTH} tokens; CE in nats per token")
    print(f"| {'engine, weights':<50} | {'CE':>8} | {'perplexity':>10} | {'MTP t+2 top-1':>14} |")
    print(f"|{'-' * 52}|{'-' * 10}|{'-' * 12}|{'-' * 16}|")
    fp32, dense = AttentionOptions(), AttentionOptions(sparse=False)
    if args.float_dir:
        ref = evaluate(load_reference(args.float_dir), stream, LENGTH)
        print(row("transformers fp32, float weights", ref.next, ref.mtp_top1))
        print(row("dayzero fp32, float weights", dayzero_loss(args.float_dir, rows, torch.float32, fp32)))
        print(row("dayzero bf16, float weights", dayzero_loss(args.float_dir, rows, torch.bfloat16, fp32)))
        with tempfile.TemporaryDirectory() as tmp:
            fp4 = mixed(args.float_dir, args.checkpoint, EXPERT, "fp4", Path(tmp) / "fp4")
            fp8 = mixed(args.float_dir, args.checkpoint, DENSE, None, Path(tmp) / "fp8")
            print(row("dayzero fp32, FP4 experts (dense float)", dayzero_loss(fp4, rows, torch.float32, fp32)))
            print(row("dayzero fp32, FP8 dense (experts float)", dayzero_loss(fp8, rows, torch.float32, fp32)))
    shipped = evaluate(load_reference(args.checkpoint), stream, LENGTH)
    print(row("transformers fp32, as shipped (dequantized)", shipped.next, shipped.mtp_top1))
    print(
        row(
            "dayzero fp32, as shipped (FP4 experts, FP8 dense)",
            dayzero_loss(args.checkpoint, rows, torch.float32, fp32),
        )
    )
    print(row("dayzero bf16, as shipped", dayzero_loss(args.checkpoint, rows, torch.bfloat16, fp32)))
    print(
        row("dayzero fp32, as shipped, sparse selection off", dayzero_loss(args.checkpoint, rows, torch.float32, dense))
    )


if __name__ == "__main__":
    main()
