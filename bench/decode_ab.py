"""Decode step time of two source trees side by side, in one process: a change to the model path, A/B.

Each tree's ``shared/dayzero`` is copied into a scratch folder as its own package (``tree_a``,
``tree_b``: the package imports itself relatively), both load the same demo checkpoint, prefill
the same prompt, then decode in turns: a few steps of one, the same of the other, the order
swapped every round. Both see the same machine at the same moment, so the median of the rounds'
paired ratios carries far less of this VM's drift (two runs of ``model.py`` moved by 20% here)
than two benchmark runs one after the other. Run it with the same tree twice to see the noise
left. ``--batch N`` decodes N sequences together; ``--speculative K`` runs speculative rounds
with K drafts of the MTP layer (the random checkpoint's drafts are almost never right: the
verify, rollback and re-run overhead); ``--temperature T [--top-p P]`` samples each step's tokens
as the decode loop does (``completion.next_steps``; greedy argmax otherwise). Run: ``python
bench/decode_ab.py TREE_A TREE_B [--rounds 200] [--steps 8] [--batch 1] [--speculative 0]
[--temperature 0] [--top-p 1]`` (e.g. a ``git worktree`` of main against the working tree).
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from options import bench_parser

NAMES = ("tree_a", "tree_b")
MODULES = (
    "checkpoint",
    "completion",
    "demo",
    "kv.pools",
    "model.forward",
    "model.plan",
    "sampling",
    "speculative",
    "tokenizer",
)


class Decoder:
    """One tree's model and sequences, prefilled; ``steps(n)`` decodes n steps (or speculative rounds)."""

    def __init__(
        self, mods: dict, checkpoint: Path, prompts: list[list[int]], room: int, k: int, sampling: dict
    ) -> None:
        self.mods, self.k, self.ids = mods, k, [f"s{i}" for i in range(len(prompts))]
        self.sampled = bool(sampling.get("temperature"))
        self.model = mods["checkpoint"].load_model(checkpoint, progress=False)
        longest = max(map(len, prompts)) + room
        self.pools = mods["kv.pools"].pools_for(self.model.cfg, torch.float32, longest, len(prompts), mtp=k > 0)
        params = mods["sampling"].SamplingParams(max_tokens=1 << 20, ignore_eos=True, **sampling)
        codec = mods["tokenizer"].IdsOnlyCodec()
        self.completions = [mods["completion"].Completion(codec, params, (), len(p), 1 << 30) for p in prompts]
        logits = mods["model.forward"].prefill(self.model, self.pools, self.ids, prompts)
        self.pending = [c.next(row).token for c, row in zip(self.completions, logits, strict=True)]

    def steps(self, n: int) -> float:
        """Seconds per step (round) over ``n`` of them."""
        spec = self.mods["speculative"]
        speculation = spec.Speculation(self.k) if self.k else None
        start = time.perf_counter()
        for _ in range(n):
            if speculation is None:
                logits = self.mods["model.forward"].decode(self.model, self.pools, self.ids, self.pending)
                if self.sampled:
                    self.pending = [s.token for s in self.mods["completion"].next_steps(self.completions, logits)]
                else:
                    self.pending = logits.argmax(dim=-1).tolist()
            else:
                options = self.mods["model.plan"].AttentionOptions()
                rounds, _ = spec.decode_round(
                    self.model, self.pools, self.ids, self.pending, self.completions, speculation, options
                )
                self.pending = [r[-1].token for r in rounds]
        return (time.perf_counter() - start) / n


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/dayzero)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--steps", type=int, default=8, help="decode steps of each tree a round")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    parser.add_argument("--speculative", type=int, default=0, choices=(0, 1, 2), help="MTP drafts per step (0: off)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample each step's tokens (0: greedy argmax)")
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in zip(NAMES, args.trees, strict=True):
            shutil.copytree(tree / "shared" / "dayzero", Path(tmp) / "packages" / name)
        sys.path.insert(0, str(Path(tmp) / "packages"))
        mods = {n: {m: importlib.import_module(f"{n}.{m}") for m in MODULES} for n in NAMES}
        checkpoint = mods["tree_a"]["demo"].write_demo_checkpoint(Path(tmp) / "demo")
        torch.manual_seed(0)
        vocab = mods["tree_a"]["checkpoint"].load_model(checkpoint, progress=False).cfg.vocab_size
        prompts = [torch.randint(2, vocab, (args.prompt_tokens + 7 * i,)).tolist() for i in range(args.batch)]
        room = (args.rounds + 2) * args.steps * (args.speculative + 1)
        sampling = {"temperature": args.temperature, "top_p": args.top_p}
        decoders = {n: Decoder(mods[n], checkpoint, prompts, room, args.speculative, sampling) for n in NAMES}
        for decoder in decoders.values():
            decoder.steps(args.steps)  # warm-up: first calls
        times = {n: [] for n in NAMES}
        for i in range(args.rounds):
            for n in NAMES if i % 2 == 0 else NAMES[::-1]:
                times[n].append(decoders[n].steps(args.steps))
    a, b = times["tree_a"], times["tree_b"]
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    what = f"speculative rounds (k = {args.speculative})" if args.speculative else "decode"
    what += f", temperature {args.temperature}, top-p {args.top_p}" if args.temperature else ", greedy"
    print(
        f"{what} at batch {args.batch}, demo checkpoint, {args.prompt_tokens}-token prompts, "
        f"{args.rounds} rounds of {args.steps} steps each"
    )
    print("| tree | median us/step | fastest round us/step |")
    print("|---|---:|---:|")
    for n, tree, t in (("A", args.trees[0], a), ("B", args.trees[1], b)):
        print(f"| {n}: {tree} | {statistics.median(t) * 1e6:.0f} | {min(t) * 1e6:.0f} |")
    same = decoders["tree_a"].pending == decoders["tree_b"].pending
    print(
        f"B faster than A by {statistics.median(ratios):.3f}x (median of the rounds' paired ratios); "
        f"fastest rounds {min(a) / min(b):.3f}x; same last tokens: {same}"
    )


if __name__ == "__main__":
    main()
