"""Whether speculative decoding can run on a model, from its config alone: what a worker checks
before it starts and ``inspect`` from a checkpoint's headers, neither importing the model's
forward (``speculative``) to ask."""

from __future__ import annotations

from .config import ModelConfig


def speculation_problem(cfg: ModelConfig, mtp_layers: int, tokens: int) -> str | None:
    """Why drafting ``tokens`` per step cannot run on a model of ``cfg`` with ``mtp_layers`` MTP layers
    loaded (None: it can); checked at startup, and by ``inspect`` from the checkpoint's headers."""
    if not mtp_layers:
        return "needs a checkpoint with an MTP layer (mtp.0.*)"
    rate = min({cfg.compress_rate(i) for i in range(cfg.num_layers + mtp_layers)} - {0}, default=tokens + 1)
    if tokens + 1 > rate:  # a verify step may span one compressor window at most (kv.snapshot)
        return f"of {tokens} makes steps of {tokens + 1} positions, more than the compress rate {rate}"
    return None


def speculation_refused(cfg: ModelConfig, mtp_layers: int, tokens: int) -> str | None:
    """A worker's refusal to start with DAYZERO_SPECULATIVE_TOKENS=``tokens`` (None: it starts)."""
    problem = tokens and speculation_problem(cfg, mtp_layers, tokens)
    return f"DAYZERO_SPECULATIVE_TOKENS {problem}" if problem else None
