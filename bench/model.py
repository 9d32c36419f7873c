"""Prefill and decode tokens/s: dayzero vs transformers on the built-in tiny checkpoint.

Batch 1, 512 prompt tokens, 64 new tokens (greedy), fp32 on CPU; median of several runs,
both engines measured side by side in one process, rounds alternating which goes first (the
ratio of the medians, and the median of each round's own ratio: this VM's speed drifts between
rounds); then the aten ops each engine dispatches per decode step (counted, not timed) at batch 1
and at batch 8 (eight prompts of the same length). Run: ``python bench/model.py``.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time

import torch
from options import bench_parser
from torch.utils._python_dispatch import TorchDispatchMode

from dayzero.checkpoint import load_model
from dayzero.demo import write_demo_checkpoint
from dayzero.kv.pools import pools_for
from dayzero.model.forward import decode, prefill


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def dayzero_run(model, prompts: list[list[int]], new: int, counter: OpCount | None = None) -> tuple[float, float]:
    seqs = [f"s{i}" for i in range(len(prompts))]
    pools = pools_for(model.cfg, torch.float32, len(prompts[0]) + new, max_sequences=len(prompts))
    start = time.perf_counter()
    logits = prefill(model, pools, seqs, prompts)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    with counter or contextlib.nullcontext():
        for _ in range(new):
            logits = decode(model, pools, seqs, logits.argmax(-1).tolist())
    return prefill_s, time.perf_counter() - start


@torch.inference_mode()
def transformers_run(ref, prompts: list[list[int]], new: int, counter: OpCount | None = None) -> tuple[float, float]:
    from transformers import DynamicCache

    cache = DynamicCache(config=ref.config)
    start = time.perf_counter()
    logits = ref(torch.tensor(prompts), cache=cache, use_cache=True).logits[:, -1]
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    with counter or contextlib.nullcontext():
        for _ in range(new):
            logits = ref(logits.argmax(-1)[:, None], cache=cache, use_cache=True).logits[:, -1]
    return prefill_s, time.perf_counter() - start


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_demo_checkpoint(tmp)
        from transformers import DeepseekV4ForCausalLM

        ref = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        ours = load_model(path, progress=False)
    prompt = torch.randint(2, ours.cfg.vocab_size, (args.prompt_tokens,)).tolist()
    results = {"dayzero": [], "transformers": []}
    for i in range(args.runs + 1):  # first round is warm-up, dropped; the order alternates
        for name in ("dayzero", "transformers") if i % 2 else ("transformers", "dayzero"):
            run = (
                dayzero_run(ours, [prompt], args.new_tokens)
                if name == "dayzero"
                else transformers_run(ref, [prompt], args.new_tokens)
            )
            results[name].append(run)
    rates = {}
    for name, runs in results.items():
        runs = runs[1:]
        rates[name] = (
            args.prompt_tokens / statistics.median(r[0] for r in runs),
            args.new_tokens / statistics.median(r[1] for r in runs),
        )
    print(
        f"tiny demo checkpoint, batch 1, {args.prompt_tokens} prompt + {args.new_tokens} new tokens, "
        f"fp32 CPU, median of {args.runs} runs, {torch.get_num_threads()} threads"
    )
    print(f"| {'engine':<13} | {'prefill tok/s':>13} | {'decode tok/s':>12} |")
    print(f"|{'-' * 15}|{'-' * 15}|{'-' * 14}|")
    for name, (p, d) in rates.items():
        print(f"| {name:<13} | {p:13.0f} | {d:12.1f} |")
    p_ratio = rates["dayzero"][0] / rates["transformers"][0]
    d_ratio = rates["dayzero"][1] / rates["transformers"][1]
    print(f"| {'ratio dz/tf':<13} | {p_ratio:12.2f}x | {d_ratio:11.2f}x |")
    paired = [  # each round's two runs back to back: a ratio per round, robust to the machine's drift
        statistics.median(t[k] / d[k] for d, t in zip(results["dayzero"][1:], results["transformers"][1:], strict=True))
        for k in (0, 1)
    ]
    print(f"| {'paired ratio':<13} | {paired[0]:12.2f}x | {paired[1]:11.2f}x |  (median of the rounds' own ratios)")
    others = torch.randint(2, ours.cfg.vocab_size, (7, args.prompt_tokens)).tolist()
    batches = {1: [prompt], 8: [prompt, *others]}  # prompts of one length: transformers' batch needs no padding
    print(f"| {'aten ops a decode step':<24} | {'batch 1':>7} | {'batch 8':>7} |")
    print(f"|{'-' * 26}|{'-' * 9}|{'-' * 9}|")
    for name, run, engine in (("dayzero", dayzero_run, ours), ("transformers", transformers_run, ref)):
        counters = {batch: OpCount() for batch in batches}
        for batch, prompts in batches.items():
            run(engine, prompts, args.new_tokens, counters[batch])
        print(f"| {name:<24} | {counters[1].ops / args.new_tokens:7.0f} | {counters[8].ops / args.new_tokens:7.0f} |")


if __name__ == "__main__":
    main()
