"""Streaming detokenization: the decode worker's cost per token as an output grows.

``StreamDecoder.push`` on the demo tokenizer, one output of plain English pushed token by token;
prints the total and the cost per token at 500, 2000 and 4000 tokens (flat: each push decodes only
the text since the last release; growing: it re-decodes everything). Run: ``python bench/detokenize.py``.
"""

import pathlib
import tempfile
import time

from dayzero.demo import write_demo_checkpoint
from dayzero.tokenizer import StreamDecoder, TextCodec

codec = TextCodec.from_checkpoint(write_demo_checkpoint(pathlib.Path(tempfile.mkdtemp()) / "demo"))
ids = codec.encode("The quick brown fox jumps over the lazy dog. " * 400)[1:][:4000]
print("| output tokens | total ms | us per token |\n|---|---|---|")
for n in (500, 2000, 4000):
    runs = []
    for _ in range(3):
        stream, start = StreamDecoder(codec), time.perf_counter()
        for token in ids[:n]:
            stream.push(token)
        runs.append(time.perf_counter() - start)
    best = sorted(runs)[1]  # the median of 3
    print(f"| {n} | {best * 1e3:.1f} | {best / n * 1e6:.1f} |")
