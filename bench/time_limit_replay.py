"""The time limit's replay of a waiting request's stream (``time_limit.past_limit``: its completion's
text state rebuilt from every token it streamed, ``CompletionText.replayed``), in the thread that
runs it (the gateway's reaper, a decode worker's waiting list): one output of plain English on the
demo tokenizer, at ``--tokens`` counts; plain, with 4 stop strings, and in thinking mode (the thought
its first half, then ``</think>`` and the answer). Median of ``--runs``; ms in all and us a token.
Run: ``python bench/time_limit_replay.py [--tokens 1000 10000 100000] [--runs 3]``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from options import bench_parser

from dayzero.demo import write_demo_checkpoint
from dayzero.params import SamplingParams
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.time_limit import past_limit
from dayzero.tokenizer import TextCodec

TEXT = "The quick brown fox jumps over the lazy dog. "
STOPS = ("<|end|>", "\n\nUser:", "Observation:", "dog!")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 10000, 100000], help="streamed tokens")
    parser.add_argument("--runs", type=int, default=3, help="runs per median")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        codec = TextCodec.from_checkpoint(write_demo_checkpoint(Path(tmp) / "demo"))
    words = codec.encode(TEXT * 100, special=False)
    end_think = codec.encode("</think>", special=False)
    cases = {
        "plain": (SamplingParams(max_tokens=1_000_000), False),
        "4 stop strings": (SamplingParams(max_tokens=1_000_000, stop=STOPS), False),
        "thinking": (SamplingParams(max_tokens=1_000_000), True),
    }
    print(f"median of {args.runs}\n| case | streamed tokens | ms | us per token |\n|---|---|---|---|")
    for name, (sampling, thinking) in cases.items():
        for n in args.tokens:
            ids = (words * (n // len(words) + 1))[:n]
            if thinking:
                ids = ids[: n // 2] + end_think + ids[n // 2 + len(end_think) :]
            request = GenerationRequest(
                request_id="r", prompt_ids=(0, 5), sampling=sampling, created=0.0, thinking=thinking
            )
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                end = past_limit(codec, request, ids, 1.0)
                times.append(time.perf_counter() - start)
            assert end.reason == "length", end
            took = statistics.median(times)
            print(f"| {name} | {n} | {took * 1e3:.1f} | {took / n * 1e6:.1f} |")


if __name__ == "__main__":
    main()
