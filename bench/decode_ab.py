"""Decode step time of two source trees side by side, in one process: a change to the model path, A/B.

Each tree's ``shared/dayzero`` is copied into a scratch folder as its own package (``tree_a``,
``tree_b``: the package imports itself relatively), both load the same demo checkpoint, prefill
the same prompt, then decode in turns: a few steps of one, the same of the other, the order
swapped every round. Both see the same machine at the same moment, so the median of the rounds'
paired ratios carries far less of this VM's drift (two runs of ``model.py`` moved by 20% here)
than two benchmark runs one after the other. Run it with the same tree twice to see the noise
left. Run: ``python bench/decode_ab.py TREE_A TREE_B [--rounds 200] [--steps 8]`` (e.g. a
``git worktree`` of main against the working tree).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

NAMES = ("tree_a", "tree_b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (each with shared/dayzero)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--steps", type=int, default=8, help="decode steps of each tree a round")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in zip(NAMES, args.trees, strict=True):
            shutil.copytree(tree / "shared" / "dayzero", Path(tmp) / "packages" / name)
        sys.path.insert(0, str(Path(tmp) / "packages"))
        mods = {
            n: {m: importlib.import_module(f"{n}.{m}") for m in ("checkpoint", "demo", "kv.pools", "model.forward")}
            for n in NAMES
        }
        checkpoint = mods["tree_a"]["demo"].write_demo_checkpoint(Path(tmp) / "demo")
        models = {n: mods[n]["checkpoint"].load_model(checkpoint, progress=False) for n in NAMES}
        torch.manual_seed(0)
        prompt = torch.randint(2, models["tree_a"].cfg.vocab_size, (args.prompt_tokens,)).tolist()
        state, times = {}, {n: [] for n in NAMES}
        for n in NAMES:
            forward = mods[n]["model.forward"]
            pools = mods[n]["kv.pools"].pools_for(
                models[n].cfg, torch.float32, len(prompt) + (args.rounds + 2) * args.steps
            )
            token = int(forward.prefill(models[n], pools, ["s"], [prompt])[0].argmax())
            for _ in range(args.steps):  # warm-up: first calls
                token = int(forward.decode(models[n], pools, ["s"], [token])[0].argmax())
            state[n] = (pools, token)
        for i in range(args.rounds):
            for n in NAMES if i % 2 == 0 else NAMES[::-1]:
                (pools, token), forward = state[n], mods[n]["model.forward"]
                start = time.perf_counter()
                for _ in range(args.steps):
                    token = int(forward.decode(models[n], pools, ["s"], [token])[0].argmax())
                times[n].append((time.perf_counter() - start) / args.steps)
                state[n] = (pools, token)
    a, b = times["tree_a"], times["tree_b"]
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    print(
        f"decode at batch 1, demo checkpoint, {args.prompt_tokens}-token prompt, "
        f"{args.rounds} rounds of {args.steps} steps each"
    )
    print("| tree | median us/step | fastest round us/step |")
    print("|---|---:|---:|")
    for n, tree, t in (("A", args.trees[0], a), ("B", args.trees[1], b)):
        print(f"| {n}: {tree} | {statistics.median(t) * 1e6:.0f} | {min(t) * 1e6:.0f} |")
    same = state["tree_a"][1] == state["tree_b"][1]
    print(
        f"B faster than A by {statistics.median(ratios):.3f}x (median of the rounds' paired ratios); "
        f"fastest rounds {min(a) / min(b):.3f}x; same last token: {same}"
    )


if __name__ == "__main__":
    main()
