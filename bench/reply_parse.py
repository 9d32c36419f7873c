"""What splitting a chat reply into reasoning, content and tool calls costs the gateway (on its event
loop): a body's whole text at once (``parse_message``), and a stream's pieces of ``--piece``
characters (``AssistantStream``), for replies of ``--kb`` KiB:

- ``prose``: text with no ``<`` (nothing a thought's mark could start);
- ``markup``: HTML and comparisons, a ``<`` every ~12 characters (code a model writes);
- ``stray mark``: ``markup`` with one ``<think>`` in it (HTML or code that mentions the mark);
- ``nested marks``: ``<`` x N then ``think>`` x N (the marks' starts held N deep, then dropped).

Medians of ``--runs``, milliseconds. Compare two commits back to back: run it in each one's checkout
(it imports the ``shared`` of the tree it is in).

    .venv/bin/python bench/reply_parse.py [--kb 200] [--piece 4] [--runs 5]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from options import bench_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shared"))  # (this tree's, not the venv's)
from dayzero.chat.output import AssistantStream, parse_message  # noqa: E402


def replies(kb: int) -> dict[str, str]:
    size = kb << 10
    prose = "The quick brown fox jumps over the lazy dog. "
    markup = "<div class='a'><p>if a < b and c > d</p></div>\n"
    deep = size // 7
    return {
        "prose": prose * (size // len(prose)),
        "markup": markup * (size // len(markup)),
        "stray mark": "<think>" + markup * (size // len(markup)),
        "nested marks": "<" * deep + "think>" * deep + "x",
    }


def body(text: str, _piece: int) -> None:
    parse_message(text, thinking=False, stopped=True)


def stream(text: str, piece: int) -> None:
    parts = AssistantStream(thinking=False)
    for i in range(0, len(text), piece):
        parts.feed(text[i : i + piece])
    parts.finish(stopped=True)


def median_ms(run, text: str, piece: int, runs: int) -> float:
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        run(text, piece)
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1000


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--kb", type=int, default=200, help="reply size in KiB")
    parser.add_argument("--piece", type=int, default=4, help="a stream's piece, in characters")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'reply':14s} {'body ms':>9s} {'stream ms':>10s}")
    for name, text in replies(args.kb).items():
        ms = [median_ms(run, text, args.piece, args.runs) for run in (body, stream)]
        print(f"{name:14s} {ms[0]:9.1f} {ms[1]:10.1f}")


if __name__ == "__main__":
    main()
