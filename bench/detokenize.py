"""The decode worker's text work per token: streaming detokenization and stop-string matching.

``StreamDecoder.push`` on the demo tokenizer, one output of plain English pushed token by token;
prints the total and the cost per token at ``--tokens`` counts (flat: each push decodes only the text
since the last release; growing: it re-decodes everything). Then ``StopMatcher.feed`` on the same text
(its first 2,000 tokens) with ``--stops`` counts of stop strings of 256 characters that each begin like
the text (the worst case: a partial match is held at nearly every token). Then a checkpoint without
a tokenizer's stream (``IdsOnlyCodec``: no text) through ``CompletionText.push`` at ``--ids-only``
counts (flat: nothing is held; growing: every id since the first is kept and decoded again).
Median of ``--runs``.
Run: ``python bench/detokenize.py [--tokens 500 2000 4000] [--stops 0 4 16] [--ids-only 10000 100000] [--runs 3]``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from options import bench_parser

from dayzero.completion_text import CompletionText, StopMatcher
from dayzero.demo import write_demo_checkpoint
from dayzero.ids_only_codec import IdsOnlyCodec
from dayzero.params import SamplingParams
from dayzero.stream_decoder import StreamDecoder
from dayzero.tokenizer import TextCodec

TEXT = "The quick brown fox jumps over the lazy dog. "


def median_of(runs: int, run: Callable[[], None]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def detokenize(codec: TextCodec, ids: list[int]) -> None:
    stream = StreamDecoder(codec)
    for token in ids:
        stream.push(token)


def stream_ids_only(count: int) -> None:
    text = CompletionText(IdsOnlyCodec(), SamplingParams(max_tokens=count), False)
    for token in range(count):
        text.push(token)


def match(stops: tuple[str, ...], deltas: list[str]) -> None:
    matcher = StopMatcher(stops)
    for delta in deltas:
        matcher.feed(delta)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[500, 2000, 4000], help="output lengths (<= 4000)")
    parser.add_argument("--stops", type=int, nargs="+", default=[0, 4, 16], help="stop-string counts")
    parser.add_argument("--ids-only", type=int, nargs="+", default=[10_000, 100_000], help="ids-only output lengths")
    parser.add_argument("--runs", type=int, default=3, help="runs per median")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        codec = TextCodec.from_checkpoint(write_demo_checkpoint(Path(tmp) / "demo"))
    ids = codec.encode(TEXT * 400)[1:][:4000]

    print(f"median of {args.runs}\n| output tokens | total ms | us per token |\n|---|---|---|")
    for n in args.tokens:
        took = median_of(args.runs, lambda n=n: detokenize(codec, ids[:n]))
        print(f"| {n} | {took * 1e3:.1f} | {took / n * 1e6:.1f} |")

    deltas = [codec.decode([token]) for token in ids[:2000]]
    print("\n| stop strings (256 characters) | us per token |\n|---|---|")
    for count in args.stops:
        stops = tuple((TEXT * 6)[: 255 - len(str(i))] + f"{i}!" for i in range(count))
        print(f"| {count} | {median_of(args.runs, lambda stops=stops: match(stops, deltas)) / len(deltas) * 1e6:.1f} |")

    print("\n| output tokens (ids-only codec) | total ms | us per token |\n|---|---|---|")
    for n in args.ids_only:
        took = median_of(args.runs, lambda n=n: stream_ids_only(n))
        print(f"| {n} | {took * 1e3:.1f} | {took / n * 1e6:.1f} |")


if __name__ == "__main__":
    main()
