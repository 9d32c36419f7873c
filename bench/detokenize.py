"""The decode worker's text work per token: streaming detokenization and stop-string matching.

``StreamDecoder.push`` on the demo tokenizer, one output of plain English pushed token by token;
prints the total and the cost per token at 500, 2000 and 4000 tokens (flat: each push decodes only
the text since the last release; growing: it re-decodes everything). Then ``StopMatcher.feed`` on
the same text with 0, 4 and 16 stop strings of 256 characters that each begin like the text (the
worst case: a partial match is held at nearly every token). Run: ``python bench/detokenize.py``.
"""

import pathlib
import tempfile
import time

from dayzero.completion import StopMatcher
from dayzero.demo import write_demo_checkpoint
from dayzero.tokenizer import StreamDecoder, TextCodec

codec = TextCodec.from_checkpoint(write_demo_checkpoint(pathlib.Path(tempfile.mkdtemp()) / "demo"))
text = "The quick brown fox jumps over the lazy dog. "
ids = codec.encode(text * 400)[1:][:4000]


def median_of_3(run) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def detokenize(n: int) -> None:
    stream = StreamDecoder(codec)
    for token in ids[:n]:
        stream.push(token)


print("| output tokens | total ms | us per token |\n|---|---|---|")
for n in (500, 2000, 4000):
    best = median_of_3(lambda n=n: detokenize(n))
    print(f"| {n} | {best * 1e3:.1f} | {best / n * 1e6:.1f} |")

deltas = [codec.decode([token]) for token in ids[:2000]]
print("\n| stop strings (256 characters) | us per token |\n|---|---|")
for count in (0, 4, 16):
    stops = tuple((text * 6)[: 255 - len(str(i))] + f"{i}!" for i in range(count))

    def match(stops=stops) -> None:
        matcher = StopMatcher(stops)
        for delta in deltas:
            matcher.feed(delta)

    print(f"| {count} | {median_of_3(match) / len(deltas) * 1e6:.1f} |")
