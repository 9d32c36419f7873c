"""What a request's grammar costs before its first token: compiling it (llguidance, under dayzero's
limits), the first time a process meets it and again (``dayzero.grammars``: a copy of the cached
one), for JSON schemas of N properties (all optional: llguidance's worst case, or all required);
and what the masks of a step cost under a huge enum (20 strings of 100,000 or 20,000 characters).

The compile runs in a thread of its own (the serving loops admit the request once it is compiled,
the others go on meanwhile); before, every stage ran it on its loop (prefill's and decode's: the
whole batch waited).

    .venv/bin/python bench/guided_compile.py [--properties 1000 2000 4000 8000 10000] [--enum-chars 100000 20000] [--v4]
"""

from __future__ import annotations

import time

import numpy as np
from options import bench_parser

from dayzero.chat.grammar import error_summary, json_grammar
from dayzero.chat.tokens import SPECIAL_TOKENS
from dayzero.demo import build_tokenizer
from dayzero.grammars import Grammars
from dayzero.guided import Grammar, GrammarFailed, Guide, fill_masks
from dayzero.tokenizer import TextCodec

TYPES = ("integer", "string", "number", "boolean")


def schema(properties: int, required: bool) -> dict:
    props = {f"p{j}": {"type": TYPES[j % len(TYPES)]} for j in range(properties)}
    return {"type": "object", "properties": props, **({"required": list(props)} if required else {})}


def compile_costs(codec: TextCodec, sizes: list[int]) -> None:
    print("compiling a schema's grammar (demo vocabulary), a fresh process's cache each row")
    print("| properties | required | grammar KB | first s | again ms | result |\n|--:|---|--:|--:|--:|---|")
    for properties in sizes:
        for required in (False, True):
            lark, grammars = json_grammar(schema(properties, required)), Grammars(codec.guidance)
            start = time.perf_counter()
            matcher = grammars.matcher(lark)
            first = time.perf_counter() - start
            start = time.perf_counter()
            grammars.matcher(lark)
            again = time.perf_counter() - start
            result = f"400: {error_summary(matcher.get_error())}" if matcher.is_error() else "ok"
            print(f"| {properties} | {required} | {len(lark) / 1e3:.0f} | {first:.2f} | {again * 1e3:.2f} | {result} |")


def enum_costs(codecs: dict[str, TextCodec], chars: int, steps: int = 8) -> None:
    grammar = Grammar(json_grammar({"enum": [chr(ord("a") + i) * chars for i in range(20)]}))
    print(f"\nan enum of 20 strings of {chars:,} characters: a step's masks, one row, the lowest token allowed")
    print("| vocabulary | compile s | mask ms/step (median) | mask ms/step (max) | steps | end |")
    print("|---|--:|--:|--:|--:|---|")
    for label, codec in codecs.items():
        start = time.perf_counter()
        guide = Guide(Grammars(codec.guidance), grammar)
        build, times, end = time.perf_counter() - start, [], "ok"
        for _ in range(steps):
            start = time.perf_counter()
            bitmask = fill_masks([guide])
            times.append((time.perf_counter() - start) * 1e3)
            try:
                guide.accept(int(np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little").nonzero()[0][0]))
            except GrammarFailed as failed:
                end = str(failed)
                break
        times.sort()
        median, most = times[len(times) // 2], times[-1]
        print(f"| {label} | {build:.2f} | {median:.1f} | {most:.1f} | {len(times)} | {end} |")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--properties", type=int, nargs="+", default=[1000, 2000, 4000, 8000, 10000])
    parser.add_argument("--enum-chars", type=int, nargs="+", default=[100_000, 20_000])
    parser.add_argument("--v4", action="store_true", help="the enum also at V4's vocabulary size (slow to build)")
    args = parser.parse_args()
    demo = TextCodec(build_tokenizer(512), tokens={"eos_token": SPECIAL_TOKENS[1]})
    compile_costs(demo, args.properties)
    codecs = {"demo (415)": demo}
    if args.v4:
        from guided import V4_VOCAB, synthetic_tokenizer

        codecs[f"V4-size ({V4_VOCAB})"] = TextCodec(
            synthetic_tokenizer(V4_VOCAB), tokens={"eos_token": SPECIAL_TOKENS[1]}
        )
    for chars in args.enum_chars:
        enum_costs(codecs, chars)


if __name__ == "__main__":
    main()
