"""The gateway's work to refuse prompt text over the context from its size (``TextCodec.encode(text,
limit)``), on a DeepSeek-like tokenizer: the demo's byte-level BPE (12 bytes a model token at most)
under DeepSeek-V3's pre-tokenizers, with 800 ``<｜place▁holder▁no▁N｜>`` added tokens as V3's (810
added in all, each but ``｜DSML｜`` beginning with "<"). Median of ``--runs``, milliseconds, one table.

Rows: 1 MiB of space-free HTML (a "<" in every 4 bytes, no added token's text: the bound that let
each "<" begin a 33-byte added token proved 31,776 tokens, so it was tokenized whole to be refused,
the "whole" column); the cost of finding the added tokens a 1 MiB text holds (ASCII; UCS-2 with CJK
and a chat's markers; 46,602 added tokens); space-free text under the bound (base64, CJK, digits,
minified JSON): tokenized whole before the count refused it, now in pieces until they pass the limit
where it can be cut (``dayzero.prompt_pieces``: base64, JSON, digits in threes; CJK still whole).
Run: ``python bench/prompt_bound.py [--limit 65536] [--runs 5]``.
"""

from __future__ import annotations

import base64
import functools
import json
import random

from options import bench_parser
from prompt_head import median_ms

from dayzero.demo import DEMO_CONFIG, build_tokenizer, deepseek_v3_pre_tokenizer
from dayzero.tokenizer import TextCodec

MIB = 1 << 20


def deepseek_like() -> TextCodec:
    tokenizer = build_tokenizer(DEMO_CONFIG["vocab_size"])
    tokenizer.pre_tokenizer = deepseek_v3_pre_tokenizer()
    tokenizer.add_special_tokens([f"<｜place▁holder▁no▁{i}｜>" for i in range(800)])
    return TextCodec(tokenizer)


def repeated(piece: str, size: int) -> str:
    return (piece * (size // len(piece.encode()) + 1))[: size // len(piece.encode()) * len(piece)]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--limit", type=int, default=65536)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    codec, rng = deepseek_like(), random.Random(0)
    bound = codec.token_bytes
    print("| text | bytes | tokens | bound | whole (ms) | encode(text, limit) (ms) | added tokens found (ms) |")
    print("|---|---|---|---|---|---|---|")
    b64 = base64.b64encode(rng.randbytes(args.limit * bound.plain)).decode()
    cjk = "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(args.limit * bound.plain // 3))
    digits = "".join(rng.choice("0123456789") for _ in range(args.limit * bound.plain))
    records = [
        {"id": rng.randrange(10**6), "k": f"v{rng.randrange(99)}"} for _ in range(args.limit * bound.plain // 20)
    ]
    minified = json.dumps(records, separators=(",", ":"))
    texts = {
        "HTML, no spaces": repeated("<tr><td>cell</td><td>12</td></tr>", MIB),
        "chat of CJK and English": "<｜User｜>" + repeated("中文字符 and words, ", MIB) + "<｜Assistant｜></think>",
        "46,602 added tokens": repeated("<｜User｜>hi<｜place▁holder▁no▁7｜>", MIB),
        "base64, just under the bound": b64[: (args.limit - 1) * bound.plain],
        "CJK, just under the bound": cjk[: (args.limit - 1) * bound.plain // 3],
        "digits, just under the bound": digits[: (args.limit - 1) * bound.plain],
        "minified JSON, just under the bound": minified[: (args.limit - 1) * bound.plain],
    }
    for name, text in texts.items():
        size = len(text.encode())
        whole = median_ms(args.runs, functools.partial(codec.encode, text))
        limited = median_ms(args.runs, functools.partial(codec.encode, text, args.limit))
        found = median_ms(args.runs, functools.partial(bound.least_tokens, text, size))
        tokens, least = len(codec.encode(text)), bound.least_tokens(text, size)
        print(f"| {name} | {size:,} | {tokens:,} | {least:,} | {whole:.0f} | {limited:.0f} | {found:.1f} |")


if __name__ == "__main__":
    main()
