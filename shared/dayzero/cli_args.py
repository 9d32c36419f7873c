"""argparse ``type=`` checks shared by the ``dayzero`` commands: a bad value is argparse's one-line
usage error, before anything is loaded, trained or written."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .params import SEED_RANGE


def _reads_as(kind: str):
    """Names a check after the number it reads: argparse's "invalid KIND value: 'x'" for text that is
    no number (the check's own name, "invalid positive_float value", was printed)."""

    def named(check):
        check.__name__ = kind
        return check

    return named


def at_least(least: int):
    """An integer ``least`` or more (``positive = at_least(1)``, ``count = at_least(0)``)."""

    @_reads_as("int")
    def check(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return check


positive = at_least(1)
count = at_least(0)
# ``--checkpoint`` of the commands that serve or run a model: DAYZERO_CHECKPOINT is its default
CHECKPOINT_HELP = "checkpoint directory (default: DAYZERO_CHECKPOINT, else the built-in trained model)"


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {value}")
    return value


@_reads_as("int")
def seed(text: str) -> int:
    """A seed in the API's range (any int64): torch takes it, with the small offsets the builders
    add to it; ``generate`` reduces it as the API does (params.sampler_seed)."""
    value = int(text)
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"must be a 64-bit integer, from -2**63 to 2**63 - 1, got {value}")
    return value


@_reads_as("int")
def top_k(text: str) -> int:
    """``--top-k`` as the API reads ``top_k``: a count, or 0 or -1 (vLLM's, SGLang's) for every token."""
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 or 0 (every token) or a count, got {value}")
    return max(value, 0)


@_reads_as("float")
def positive_float(text: str) -> float:
    """A finite number above 0 (minutes, seconds, ...)."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


@_reads_as("float")
def non_negative_float(text: str) -> float:
    """A finite number of 0 or more (a size in GiB, ...)."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of 0 or more, got {text}")
    return value


def out_dir(text: str) -> Path:
    """A directory to write: one that exists, or one that can be made in its nearest existing parent."""
    path = Path(text)
    existing = next(p for p in (path, *path.parents) if p.exists())  # "." at the latest
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{existing} is not writable")
    return path
