"""What the benches' command lines share: ``--help`` prints the bench's docstring as written (what it
measures, how to run it) above its options, and a bench that needs a CUDA GPU, run on a host without
one, says so and exits ``NO_GPU_EXIT`` (0: nothing failed, nothing measured; ``bench/gpu.sh``, a GPU
session, refuses such a host first)."""

from __future__ import annotations

import argparse
import sys

NO_GPU_EXIT = 0


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """A bench's parser: ``doc`` (its module's docstring) as its description, line breaks kept."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def need_cuda(what: str) -> None:
    """Return if CUDA is here; else say that ``what`` needs it and exit ``NO_GPU_EXIT``."""
    import torch

    if not torch.cuda.is_available():
        print(f"{what} needs a CUDA GPU and this host has none: nothing measured", file=sys.stderr)
        sys.exit(NO_GPU_EXIT)
