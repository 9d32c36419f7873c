"""``dayzero train-demo OUT``: reproduce the committed demo model (see dayzero.train.pipeline)."""

from __future__ import annotations

import argparse

from .options import TrainOptions


def cmd_train_demo(args: argparse.Namespace, settings: object) -> int:
    from .pipeline import train_demo

    opts = TrainOptions(steps=args.steps, seed=args.seed, minutes=args.minutes, threads=args.threads)
    path, _ = train_demo(args.out, opts, args.float)
    print(path)
    return 0


def add_train_demo(sub: argparse._SubParsersAction) -> None:
    defaults = TrainOptions()
    cmd = sub.add_parser(
        "train-demo", help="train the tiny DeepSeek-V4 (+ MTP) on Python's reference manual, release layout"
    )
    cmd.add_argument("out", help="directory to write (the committed model is dayzero/train/demo_model)")
    cmd.add_argument("--steps", type=int, default=defaults.steps, help=f"optimizer steps (default {defaults.steps})")
    cmd.add_argument("--minutes", type=float, help="stop early after this much wall time (not reproducible)")
    cmd.add_argument("--float", help="also keep the float weights (before FP4 / FP8) in this directory")
    cmd.add_argument("--seed", type=int, default=defaults.seed, help="corpus split, init and batches (default 0)")
    cmd.add_argument(
        "--threads", type=int, default=defaults.threads, help="torch threads (default 1; results depend on it)"
    )
    cmd.set_defaults(run=cmd_train_demo)
