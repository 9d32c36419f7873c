"""Training the demo model: AdamW, warm-up then cosine decay, loss = CE(t+1) + lambda * CE(t+2).

Main model and MTP layer are trained jointly from the start (DeepSeek's recipe); the MTP loss
weight is ``mtp_weight``. Seeded, on a fixed number of threads: the same options give the same
weights on any machine.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .data import random_batch, windows
from .options import TrainOptions

if TYPE_CHECKING:
    from .model import DemoModel, Logits


@dataclass(frozen=True, slots=True)
class Losses:
    next: float  # mean CE of token t+1 (nats)
    after_next: float  # mean CE of MTP's token t+2
    mtp_top1: float  # fraction of positions whose MTP argmax is the true t+2 token


def losses(out: Logits, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] -> (CE of t+1 over T-1 positions, CE of t+2 over T-2 positions)."""
    main = F.cross_entropy(out.next[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    mtp = F.cross_entropy(out.after_next[:, :-1].flatten(0, 1), ids[:, 2:].flatten())
    return main, mtp


def _lr(step: int, opts: TrainOptions) -> float:
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    progress = (step - opts.warmup) / max(1, opts.steps - opts.warmup)
    return opts.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(
    model: DemoModel, stream: torch.Tensor, opts: TrainOptions, log: Callable[[str], None] | None = None
) -> list[float]:
    """Train in place on random windows of ``stream`` [N]; returns the total loss of every step."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(opts.threads)
    try:
        return _steps(model, stream, opts, log)
    finally:
        torch.set_num_threads(threads)


def _steps(model: DemoModel, stream: torch.Tensor, opts: TrainOptions, log: Callable[[str], None]) -> list[float]:
    gen = torch.Generator().manual_seed(opts.seed)
    torch.manual_seed(opts.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=opts.weight_decay)
    model.train()
    history: list[float] = []
    start = time.monotonic()
    for step in range(opts.steps):
        for group in optim.param_groups:
            group["lr"] = _lr(step, opts)
        ids = random_batch(stream, opts.batch, opts.length, gen)
        main, mtp = losses(model(ids), ids)
        total = main + opts.mtp_weight * mtp
        optim.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        history.append(total.item())
        elapsed = time.monotonic() - start
        if step % opts.log_every == 0 or step == opts.steps - 1:
            rate = (step + 1) * opts.batch * opts.length / elapsed
            eta = elapsed / (step + 1) * (opts.steps - step - 1)
            log(
                f"step {step + 1}/{opts.steps} loss {main.item():.3f} mtp {mtp.item():.3f} "
                f"lr {_lr(step, opts):.2e} {rate:.0f} tok/s elapsed {elapsed:.0f}s eta {eta:.0f}s"
            )
        if opts.minutes is not None and elapsed > opts.minutes * 60:
            log(f"stopping at step {step + 1}: the {opts.minutes} minute budget is spent")
            break
    return history


@torch.no_grad()
def evaluate(model: DemoModel, stream: torch.Tensor, length: int = 256, batch: int = 8) -> Losses:
    """Mean held-out losses over non-overlapping windows of ``stream`` [N]."""
    model.eval()
    sums, top1, count, count2 = torch.zeros(2), 0, 0, 0
    every = windows(stream, length)
    for begin in range(0, every.shape[0], batch):
        ids = every[begin : begin + batch]
        out = model(ids)
        main, mtp = losses(out, ids)
        n, n2 = ids[:, 1:].numel(), ids[:, 2:].numel()
        sums += torch.tensor([main.item() * n, mtp.item() * n2])
        top1 += int((out.after_next[:, :-1].argmax(-1) == ids[:, 2:]).sum())
        count, count2 = count + n, count2 + n2
    return Losses(float(sums[0] / count), float(sums[1] / count2), top1 / count2)
