"""What a long literal costs each decode step under constrained decoding: a JSON schema whose reply
must write one long string (a ``const`` of ASCII words or of CJK ones, 3 UTF-8 bytes a character;
an ``enum`` of strings sharing all but their last character, so all stay live; a ``const`` array
of ten strings of a tenth each, one literal as a whole; a ``pattern`` of the text), beside a string
only counted (minLength), at the built-in model's tokenizer (2,048 tokens) and at V4's vocabulary
size (129,280, the synthetic byte-level one of bench/guided.py: the released tokenizer is not
shipped here). llguidance's lexer pays at each step for every byte of the literal still to write:
a step near its start costs the most, and a whole reply grows quadratically in its length. Each
cell: the median CPU ms (the process's: llguidance's threads too) of one row's mask
(``guided.fill_masks``) over the reply's first ``--steps`` tokens (its canonical tokens, accepted),
median of ``--runs``.

    .venv/bin/python bench/literal_steps.py [--runs 3] [--steps 32] [--chars 1000 4000 5000 10000]
"""

from __future__ import annotations

import json
import random
import statistics
import time

from guided import V4_VOCAB, synthetic_tokenizer
from options import bench_parser

from dayzero.chat.grammar import json_grammar
from dayzero.chat.tokens import SPECIAL_TOKENS
from dayzero.guided import Guide, fill_masks
from dayzero.params import Grammar
from dayzero.settings import BUILT_IN_MODEL
from dayzero.tokenizer import TextCodec

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "sparse", "models", "decode")
CJK = "数据模型解码注意力稀疏"


def prose(chars: int, alphabet: str = "") -> str:
    """``chars`` characters of words (of ``alphabet``'s characters when given: 3 UTF-8 bytes each for CJK)."""
    rng, words = random.Random(0), WORDS if not alphabet else ["".join(alphabet[: 2 + i % 3]) for i in range(9)]
    text = ""
    while len(text) < chars:
        text += rng.choice(words) + " "
    return text[:chars]


def schemas(chars: int) -> dict[str, tuple[dict, str]]:
    """Each schema and the reply's value."""
    text, cjk = prose(chars), prose(chars, CJK)
    return {
        "const, ASCII": ({"const": text}, text),
        "const, CJK (3 B/char)": ({"const": cjk}, cjk),
        "enum of 8 (one prefix)": ({"enum": [text[:-1] + c for c in "abcdefgh"]}, text[:-1] + "a"),
        "const, an array of 10": ({"const": [text[: chars // 10]] * 10}, [text[: chars // 10]] * 10),
        "pattern, the ASCII text": ({"type": "string", "pattern": f"^{text}$"}, text),
        "minLength (no literal)": ({"type": "string", "minLength": chars, "maxLength": chars}, "x" * chars),
    }


def step_ms(codec: TextCodec, schema: dict, value: str, steps: int) -> float:
    guide = Guide(codec.grammars, Grammar(json_grammar(schema)))
    times = []
    for token in codec.encode(json.dumps(value, ensure_ascii=False), special=False)[:steps]:
        start = time.process_time()
        fill_masks([guide])
        times.append(time.process_time() - start)
        guide.accept(token)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--chars", type=int, nargs="+", default=[1000, 4000, 5000, 10_000])
    args = parser.parse_args()
    eos = {"eos_token": SPECIAL_TOKENS[1]}
    codecs = {
        "built-in (2048)": TextCodec.from_checkpoint(BUILT_IN_MODEL),
        f"V4-size ({V4_VOCAB})": TextCodec(synthetic_tokenizer(V4_VOCAB), tokens=eos),
    }
    print(f"one row's mask, CPU ms per step (median of the reply's first {args.steps} steps, of {args.runs} runs)")
    print("| vocabulary | literal | " + " | ".join(f"{c:,} chars" for c in args.chars) + " |")
    print("|---|---|" + "--:|" * len(args.chars))
    for label, codec in codecs.items():
        assert codec.guidance is not None  # (the tokenizer's trie, built once: not counted)
        for name in schemas(1):
            cells = []
            for chars in args.chars:
                schema, value = schemas(chars)[name]
                runs = [step_ms(codec, schema, value, args.steps) for _ in range(args.runs)]
                cells.append(f"{statistics.median(runs):.2f}")
            print(f"| {label} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
