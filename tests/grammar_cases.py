"""Grammars that fail late or fill llguidance's lexer, and waits for a compile: the cases the guided-decoding
tests (in-process and through the pipeline) share."""

from __future__ import annotations


def late(value: dict, flags: int = 24) -> dict:
    """An object of ``flags`` required booleans, then ``value``, required: a reply reaches it after some
    14 bytes a flag (24: past the bytes the gateway's check walks, ``SCHEMA_PROBE_STEPS``)."""
    properties = {f"b{i}": {"type": "boolean"} for i in range(flags)} | {"s": value}
    return {"type": "object", "properties": properties, "required": list(properties)}


# A pattern past llguidance's lexer, in reach only past the bytes the gateway's check walks (it passes
# it): the lexer fails on a token its mask allowed, near the string
LATE_PATTERN = late({"type": "string", "pattern": "^((a{1000}){1000}){100}$"})

# Schemas whose grammar fails after its first step (llguidance's limits, or no finite value): a
# self-referring required property; 520 optional properties, no others, past the parser's row limit
# once its '{' is in
FAILING_LATE = [
    {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
    {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(520)},
        "additionalProperties": False,
    },
]


# A pattern each random a/b reply writes new lexer states of (2^21 of them): replies fill a shared lexer
AB_PATTERN = {"type": "string", "pattern": "^[ab]*a[ab]{20}$"}


def few_lexer_states(monkeypatch, states: int) -> None:
    """Grammars compiled from here on hold at most ``states`` lexer states: a few replies fill one."""
    import llguidance

    from dayzero import grammars

    few = llguidance.LLParserLimits(initial_lexer_fuel=200_000, step_lexer_fuel=100_000, max_lexer_states=states)
    monkeypatch.setattr(grammars, "parser_limits", lambda: few)


def ready_compile(grammars, lark: str):
    """``lark``'s compile once done (compiled in a thread: the first call starts it), as a serving
    loop holds it once it saw it ready (``Runtime.grammar_ready``)."""
    return _within_a_minute(lambda: grammars.compiled(lark))


def seen_ready(runtime, ticket) -> None:
    """Until ``runtime`` sees ``ticket``'s grammar compiled (``Runtime.grammar_ready``: the ticket
    holds that compile), as a serving loop asks once a pass; a compile that never ends fails."""
    from dayzero.serving.runtime import Runtime

    _within_a_minute(lambda: Runtime.grammar_ready(runtime, ticket))


def _within_a_minute(ready):
    """``ready()``'s first true answer, asked every 10 ms; a grammar compiling for a minute fails."""
    import time

    deadline = time.monotonic() + 60
    while not (answer := ready()):
        assert time.monotonic() < deadline, "the grammar never compiled"
        time.sleep(0.01)
    return answer


def fill_lexer(grammars, lark: str) -> None:
    """Replies written through copies of ``lark``'s compile, each step's mask computed (as decode
    does: every copy grows the compile's one lexer), until the lexer is full. No ``Guide`` fails on
    it, so the compile is not retired: the next request that needs a state of it fails."""
    import json
    import random

    texts = random.Random(0)
    for _ in range(200):
        matcher = grammars.matcher(lark)
        for token in grammars.tokenizer.tokenize_str(json.dumps("".join(texts.choice("ab") for _ in range(100)))):
            matcher.compute_logit_bias()
            if matcher.is_error():
                return
            matcher.consume_token(token)
    raise AssertionError("no reply filled the lexer")
