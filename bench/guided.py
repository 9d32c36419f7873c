"""Constrained decoding's cost per decode step: the grammar masks of a whole batch (one parallel
fill + one masked fill, ``dayzero.guided.allowed_logits``), for a JSON schema, a named DSML tool
call, and tool_choice auto with a strict tool (walked in its free text, and inside its call), at
the demo tokenizer's vocabulary and at V4's (129,280 tokens, a synthetic byte-level vocabulary of
that size: the released tokenizer is not shipped here). Then what
building a grammar's lexer costs under dayzero's limits (``chat.grammar.parser_limits``) and
llguidance's defaults, for schemas in use and for a pathological pattern (a byte vocabulary: the
lexer's cost does not depend on it), matched over a valid text.

    .venv/bin/python bench/guided.py [--steps 40] [--threads 1] [--batches 1 8 32] [--pattern REGEX]
"""

from __future__ import annotations

import itertools
import json
import random
import string
import time

import torch
from options import bench_parser
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from dayzero.chat.auto_grammar import auto_calls_grammar
from dayzero.chat.grammar import _byte_tokenizer, dsml_symbol, json_grammar, parser_limits, tool_calls_grammar
from dayzero.chat.tokens import DSML, END_THINK, SPECIAL_TOKENS, THINK
from dayzero.demo import build_tokenizer
from dayzero.guided import Grammar, Guide, apply_masks, fill_masks
from dayzero.tokenizer import TextCodec

V4_VOCAB = 129_280
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
# a pattern whose lexer exhausts its fuel under both limits (each cell ERR)
PATHOLOGICAL = "^((a{1000}){1000}){100}$"
STRICT_TOOL = {"type": "function", "function": {**TOOL["function"], "strict": True}}


def synthetic_tokenizer(size: int) -> Tokenizer:
    """A byte-level BPE vocabulary of ``size`` tokens: V4's specials, the 256 bytes, then short
    pieces of letters, digits and punctuation (with and without a leading space)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for piece in sorted(alphabet):
        vocab.setdefault(piece, len(vocab))
    chars = string.ascii_letters + string.digits + '{}[]":,_-.'
    for n in itertools.count(2):
        for combo in itertools.product(chars, repeat=n):
            for lead in ("", "\u0120"):
                vocab.setdefault(lead + "".join(combo), len(vocab))
                if len(vocab) == size:
                    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
                    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
                    tok.decoder = decoders.ByteLevel()
                    tok.add_special_tokens(list(SPECIAL_TOKENS))
                    return tok
    raise AssertionError("unreachable")


def step_ms(codec: TextCodec, grammar: Grammar, batch: int, steps: int, opening: str = "") -> tuple[float, ...]:
    """(ms per request to build its matcher, ms per step to compute the batch's masks, ms per step
    to apply them to the batch's logits), each row walked at random from ``opening`` (its tokens
    accepted first, not timed)."""
    start = time.perf_counter()
    guides = [Guide(codec.grammars, grammar) for _ in range(batch)]
    build = (time.perf_counter() - start) * 1e3 / batch
    for token in (t for t in codec.encode(opening) if t != 0) if opening else ():  # (0: BOS)
        for guide in guides:
            guide.accept(token)
    rng, logits, rows = random.Random(0), torch.zeros(batch, codec.vocab_size), list(range(batch))
    fill = apply = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        bitmask = fill_masks(guides)
        middle = time.perf_counter()
        allowed = apply_masks(logits, rows, bitmask, eos=1)
        fill, apply = fill + middle - start, apply + time.perf_counter() - middle
        for row, guide in zip(allowed, guides, strict=True):
            choices = torch.nonzero(row > float("-inf")).flatten().tolist()
            token = rng.choice(choices)
            guide.accept(token if token != 1 else choices[0])
    return build, fill * 1e3 / steps, apply * 1e3 / steps


def _kept(codec: TextCodec) -> tuple[str, ...]:
    """The thought's marks, which free text under auto may hold (as the gateway's grammar)."""
    return tuple(f"<[{codec.token_id(t)}]>" for t in (THINK, END_THINK))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)  # torch's; llguidance's pool is its own
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="rows a step (default 1 8 32)")
    parser.add_argument("--pattern", default=PATHOLOGICAL, help=f"the pathological pattern (default {PATHOLOGICAL})")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    eos = {"eos_token": SPECIAL_TOKENS[1]}
    codecs = {
        "demo (415)": TextCodec(build_tokenizer(512), tokens=eos),
        f"V4-size ({V4_VOCAB})": TextCodec(synthetic_tokenizer(V4_VOCAB), tokens=eos),
    }
    print(f"grammar masks per decode step, CPU, {args.steps} steps, every row constrained")
    print("| vocabulary | grammar | batch | build ms/request | masks ms/step | apply ms/step |")
    print("|---|---|--:|--:|--:|--:|")
    for label, codec in codecs.items():
        assert codec.guidance is not None  # the tokenizer's trie, built once per process (not counted)
        grammars = {
            "json schema": Grammar(json_grammar(SCHEMA)),
            "named tool call": Grammar(
                tool_calls_grammar([TOOL], dsml_symbol(codec.token_id(DSML), DSML), "get_weather")
            ),
        }
        auto = Grammar(auto_calls_grammar([STRICT_TOOL], dsml_symbol(codec.token_id(DSML), DSML), _kept(codec)))
        grammars["auto, strict tool: text"] = auto
        grammars["auto, strict tool: its call"] = auto, f"Sure.\n\n<{DSML}tool_calls>\n"
        for (name, grammar), batch in itertools.product(grammars.items(), args.batches):
            grammar, opening = grammar if isinstance(grammar, tuple) else (grammar, "")
            build, fill, apply = step_ms(codec, grammar, batch, args.steps, opening)
            print(f"| {label} | {name} | {batch} | {build:.2f} | {fill:.2f} | {apply:.2f} |")
    print(json.dumps({"torch_threads": torch.get_num_threads()}))
    lexer_costs(args.pattern)


def lexer_costs(pattern: str) -> None:
    """Each grammar built and matched over its text, byte by byte: seconds, and whether it held
    (``pattern``: one whose lexer exhausts its fuel, its text a prefix of what it matches)."""
    import llguidance

    tools = [
        {
            "type": "function",
            "function": {
                "name": f"t{i}",
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"p{j}": {"type": ["integer", "string", "number", "boolean", "array"][j % 5]} for j in range(10)
                    },
                },
            },
        }
        for i in range(128)
    ]
    call = '<|DSML|invoke name="t127">\n<|DSML|parameter name="p1" string="true">x</|DSML|parameter>\n</|DSML|invoke>'
    cases = {
        "enum of 2000 strings": (json_grammar({"enum": [f"value-{i}" for i in range(2000)]}), '"value-1999"'),
        "128 tools, 10 parameters each": (
            tool_calls_grammar(tools, '"|DSML|"'),
            f"\n\n<|DSML|tool_calls>\n{call}\n</|DSML|tool_calls>",
        ),
        "an e-mail pattern": (
            json_grammar({"type": "string", "pattern": r"^[a-z0-9._+-]+@[a-z0-9.-]+\.[a-z]{2,}$"}),
            '"a.b@c.org"',
        ),
        f"pattern {pattern}": (json_grammar({"type": "string", "pattern": pattern}), '"aaaa'),
    }
    print("\nbuilding and matching a grammar (byte vocabulary), s; ERR: llguidance gave up")
    print("| grammar | dayzero's limits | llguidance's defaults |\n|---|--:|--:|")
    for name, (lark, text) in cases.items():
        cells = []
        for limits in (parser_limits(), None):
            start, matcher = (
                time.perf_counter(),
                llguidance.LLMatcher(_byte_tokenizer(), lark, log_level=0, limits=limits),
            )
            for byte in text.encode():
                if matcher.is_error():
                    break
                matcher.compute_logit_bias()
                matcher.consume_token(byte)
            cells.append(f"{time.perf_counter() - start:.3f}" + (" ERR" if matcher.is_error() else ""))
        print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
