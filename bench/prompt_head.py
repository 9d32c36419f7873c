"""The gateway's work to refuse prompt text over the context: ``TextCodec.encode(text, limit)`` on the
demo tokenizer (29 bytes a token at most: a text under ``limit * 29`` bytes is not refused from its
size), for plain English of ``--kb`` kilobytes against a ``--limit`` of tokens. Before: the whole text
tokenized, then counted (``encode(text)``, what the routes did); after: refused from its head when
the head's tokens pass the limit. Median of ``--runs``, milliseconds, one table.
A text under twice the head (``--limit`` x 16 characters) is counted whole either way.
Run: ``python bench/prompt_head.py [--kb 16 64 118] [--limit 4096] [--runs 5]``.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import time
from collections.abc import Callable

from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.tokenizer import PromptTooLongError, TextCodec

TEXT = "hello world, the quick brown fox jumps over the lazy dog. "


def median_ms(runs: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with contextlib.suppress(PromptTooLongError):  # (refused: what "after" measures)
            run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--kb", type=int, nargs="+", default=[16, 64, 118])
    parser.add_argument("--limit", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        codec = TextCodec.from_checkpoint(write_demo_checkpoint(root))
    print("| KB | tokens | whole, then counted (ms) | refused from its head (ms) |\n|---|---|---|---|")
    for kb in args.kb:
        text = (TEXT * (kb * 1000 // len(TEXT) + 1))[: kb * 1000]
        whole = median_ms(args.runs, functools.partial(codec.encode, text))
        head = median_ms(args.runs, functools.partial(codec.encode, text, args.limit))
        print(f"| {kb} | {len(codec.encode(text))} | {whole:.1f} | {head:.1f} |")


if __name__ == "__main__":
    main()
