"""The demo model's training options (no torch here: ``dayzero --help`` reads their defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrainOptions:
    steps: int = 300
    batch: int = 16
    length: int = 256  # tokens per training window
    lr: float = 2.5e-3
    warmup: int = 20
    weight_decay: float = 0.01
    mtp_weight: float = 0.3
    seed: int = 0
    minutes: float | None = None  # stop early once this much wall time has passed
    log_every: int = 10
    threads: int = 1  # the tiny model's step is op-overhead bound: one thread is fastest on a busy machine
