"""``dayzero train-demo OUT``: reproduce the committed demo model (see dayzero.train.pipeline)."""

from __future__ import annotations

import argparse

from .. import cli_args
from .options import TrainOptions


def cmd_train_demo(args: argparse.Namespace, settings: object) -> int:
    from ..quant.quantize import check_apart
    from .pipeline import train_demo

    if args.float is not None:  # the float weights are quantized into OUT: checked before training
        check_apart(args.out, args.float, ("OUT", "--float"))
    opts = TrainOptions(steps=args.steps, seed=args.seed, minutes=args.minutes, threads=args.threads)
    path, _ = train_demo(args.out, opts, args.float)
    print(path)
    return 0


def add_train_demo(sub: argparse._SubParsersAction) -> None:
    defaults = TrainOptions()
    cmd = sub.add_parser(
        "train-demo", help="train the tiny DeepSeek-V4 (+ MTP) on Python's reference manual, release layout"
    )
    out = "directory to write (the committed model is dayzero/train/demo_model)"
    cmd.add_argument("out", type=cli_args.out_dir, metavar="OUT", help=out)
    steps = f"optimizer steps (default {defaults.steps})"
    cmd.add_argument("--steps", type=cli_args.positive, default=defaults.steps, metavar="N", help=steps)
    minutes = "stop early after this much wall time (default: no limit; not reproducible)"
    cmd.add_argument("--minutes", type=cli_args.positive_float, metavar="M", help=minutes)
    floats = "also keep the float weights (before FP4 / FP8) in this directory"
    cmd.add_argument("--float", type=cli_args.out_dir, metavar="DIR", help=floats)
    seed = "corpus split, init and batches (default 0)"
    cmd.add_argument("--seed", type=cli_args.seed, default=defaults.seed, metavar="S", help=seed)
    threads = "torch threads (default 1; results depend on it)"
    cmd.add_argument("--threads", type=cli_args.positive, default=defaults.threads, metavar="T", help=threads)
    cmd.set_defaults(run=cmd_train_demo)
