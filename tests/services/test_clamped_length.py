"""A reply under a ``maxLength`` past what llguidance's lexer holds, through the real stack (the
random demo checkpoint, constrained decoding, max_tokens enough for ~7,000 characters): the bound
is clamped to ``MOST_COUNTED_CHARS``, so the string is written up to it and closed, the reply whole
and within the client's schema (unclamped, this seed's reply wrote on past it, 4,054 characters,
toward the lexer's limit: ~5,500, then an error after the reply began)."""

from __future__ import annotations

import json

import pytest

from dayzero.chat.schema_counts import MOST_COUNTED_CHARS

from .chat_requests import ask, post
from .conftest import start_stack

LONG = {"type": "string", "minLength": MOST_COUNTED_CHARS - 16, "maxLength": 100_000}
MOST_TOKENS = 3_800  # of a context of 4,096: some 1.9 characters a token of the demo tokenizer


@pytest.fixture(scope="module")
def long_stack(demo_dir, tmp_path_factory):
    counts = {"vision": 1, "prefill": 1, "decode": 1}  # (ready once a vision worker is up)
    stack = start_stack(
        demo_dir, tmp_path_factory.mktemp("logs"), counts, {"DAYZERO_MAX_TOKENS_LIMIT": str(MOST_TOKENS)}
    )
    yield stack
    stack.stop()


def test_a_long_string_under_a_clamped_max_length_is_written_whole(long_stack):
    fmt = {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}}
    body = ask("Write.", response_format=fmt, temperature=1.0, seed=5, max_tokens=MOST_TOKENS)
    r = post(long_stack, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", (choice["finish_reason"], r.json()["usage"])
    text = json.loads(choice["message"]["content"])
    assert LONG["minLength"] <= len(text) <= MOST_COUNTED_CHARS, len(text)
