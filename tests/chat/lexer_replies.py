"""Replies walked through llguidance under the gateway's limits, a byte a step as a model writes
them, for the tests of what one grammar's lexer holds (schema_counts, schema_splits)."""

from __future__ import annotations

import json
import os
import re
import tempfile

import llguidance

from dayzero.chat.dsml import render_calls, to_json
from dayzero.chat.grammar import (
    _byte_grammars,
    _byte_tokenizer,
    dsml_symbol,
    json_grammar,
    parser_limits,
    tool_calls_grammar,
)
from dayzero.chat.schema_size import SchemaLimits
from dayzero.chat.tokens import DSML

DEFAULTS = SchemaLimits(nodes=3000, literal_chars=100_000, pattern_chars=20_000)


def strings(*counts: dict) -> dict:
    properties = {f"s{i}": {"type": "string", **counted} for i, counted in enumerate(counts)}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def fails_mid_reply(schema: dict, reply: dict) -> bool:
    """Whether llguidance (the gateway's limits) fails writing ``reply`` a byte a step, each step's
    mask computed as in decoding (where its lexer builds its states)."""
    return _fails_writing(json_grammar(schema), json.dumps(reply, ensure_ascii=False))


def call_fails_mid_reply(tools: list[dict], name: str, arguments: dict) -> bool:
    """``fails_mid_reply`` of a forced call (tool_choice naming ``name``) writing ``arguments``."""
    block = render_calls([{"function": {"name": name, "arguments": to_json(arguments)}}])
    return _fails_writing(tool_calls_grammar(tools, dsml_symbol(None, DSML), one=name), block)


def _fails_writing(lark: str, text: str) -> bool:
    matcher = _byte_grammars().matcher(lark)
    assert not matcher.is_error()
    for byte in text.encode():  # (as a model writes: UTF-8, no escapes)
        matcher.compute_logit_bias()
        matcher.consume_token(byte)
        if matcher.is_error():
            return "lexer error: too many" in matcher.get_error()  # (states, or expressions)
    return False


def longest_reply_fails(schema: dict) -> bool:
    """Whether the reply writing each string as long as the grammar lets it (an "a" wherever one is
    allowed, else the lowest byte allowed) fails on llguidance's lexer: as a model that writes on."""
    matcher, end = _byte_grammars().matcher(json_grammar(schema)), _byte_grammars().tokenizer.eos_token
    for _ in range(20_000):
        mask = matcher.compute_logit_bias()
        if matcher.is_error():
            return "too many states" in matcher.get_error()
        allowed = [token for token in range(256) if mask[token] == 200 and token != end]
        if not allowed:
            return False
        matcher.consume_token(ord("a") if ord("a") in allowed else allowed[0])
    raise AssertionError("no end within 20,000 bytes")


def llguidance_classes(lark: str) -> int:
    """The byte classes llguidance's lexer tells apart in ``lark`` (its "alphabet size", which its
    verbose log, written to the process's standard error, reports as it compiles)."""
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            llguidance.LLMatcher(_byte_tokenizer(), lark, log_level=2, limits=parser_limits())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return int(re.search(rb"alphabet size: (\d+)", log.read())[1])
