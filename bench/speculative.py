"""Speculative decoding with the MTP layer: decode tokens/s with k = 0, 1, 2 drafts per step at
batch 1 and 16, side by side in one process, medians of several runs, plus acceptance.

Greedy, fp32. Default: the shipped trained model, prompted with windows of the held-out text it
was not trained on (its MTP layer's drafts are right about a third of the time); ``--random``: the
random demo checkpoint and random prompts (drafts almost never right: the overhead alone).
Run: ``python bench/speculative.py [--checkpoint DIR | --random]``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from options import bench_parser
from tokenizers import Tokenizer

from dayzero.checkpoint import load_model
from dayzero.completion import Completion
from dayzero.demo import write_demo_checkpoint
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.kv.pools import pools_for
from dayzero.model.forward import prefill
from dayzero.model.plan import AttentionOptions
from dayzero.sampling import SamplingParams
from dayzero.settings import BUILT_IN_MODEL, Settings
from dayzero.speculative import Acceptance, Speculation, decode_round
from dayzero.train.corpus import split
from dayzero.train.data import documents, token_stream, windows


def run(model, prompts: list[list[int]], new: int, k: int) -> tuple[float, Acceptance]:
    """-> (decode tokens/s after the first token, acceptance) for one batch."""
    ids = [f"s{i}" for i in range(len(prompts))]
    pools = pools_for(model.cfg, torch.float32, max(map(len, prompts)) + new + 3, len(prompts), mtp=k > 0)
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    completions = [Completion(IdsOnlyCodec(), params, (), len(p), 1 << 20) for p in prompts]
    pending = [c.next(row).token for c, row in zip(completions, prefill(model, pools, ids, prompts), strict=True)]
    spec, total, emitted = Speculation(k) if k else None, Acceptance(), 0
    start = time.perf_counter()
    while completions:
        rounds, acceptance = decode_round(model, pools, ids, pending, completions, spec, AttentionOptions())
        total.merge(acceptance)
        emitted += sum(len(r) for r in rounds)
        live = [i for i, c in enumerate(completions) if c.count < new]
        ids, pending = [ids[i] for i in live], [rounds[i][-1].token for i in live]
        completions = [completions[i] for i in live]
    return emitted / (time.perf_counter() - start), total


def _held_out_stream(checkpoint: Path) -> torch.Tensor:
    """The held-out manual text (train.corpus's seeded split) in the checkpoint's tokenizer."""
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    return token_stream(tokenizer, documents(split().held_out, chats=False))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--checkpoint", type=Path, default=BUILT_IN_MODEL, help="default: the shipped trained model")
    parser.add_argument("--random", action="store_true", help="the random demo checkpoint, random prompts")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        source = write_demo_checkpoint(tmp) if args.random else args.checkpoint
        # the FP4 experts as served: dequantized once into the workers' cache, not on every step
        model = load_model(source, progress=False, expert_cache_bytes=Settings().expert_cache_mb << 20)
    held_out = None if args.random else windows(_held_out_stream(args.checkpoint), args.prompt_tokens)
    rows = []
    for batch in (1, 16):
        if held_out is None:
            prompts = [torch.randint(2, model.cfg.vocab_size, (args.prompt_tokens,)).tolist() for _ in range(batch)]
        else:
            prompts = held_out[:batch].tolist()
        for k in (0, 1, 2):
            runs = [run(model, prompts, args.new_tokens, k) for _ in range(args.runs)]
            summary = runs[-1][1].summary()
            rows.append(
                {"batch": batch, "k": k, "decode_tokens_per_s": statistics.median(r[0] for r in runs), **summary}
            )
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'batch':>5} {'k':>2} {'decode tok/s':>12} {'accept/pos':>14} {'mean len':>8}")
    for r in rows:
        rates = "/".join(f"{a:.2f}" for a in r["acceptance_rate"][: r["k"]]) or "-"
        speed, length = r["decode_tokens_per_s"], r["mean_accepted_length"]
        print(f"{r['batch']:>5} {r['k']:>2} {speed:>12.1f} {rates:>14} {length:>8.2f}")


if __name__ == "__main__":
    main()
