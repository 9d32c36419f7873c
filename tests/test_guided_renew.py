"""Whose a full lexer is (``Guide.renew``): a compile's matchers share its lexer, so a failure there
is the request's own only on a compile no other matcher was copied from (or the second time at one
token): else ``LexerFilled``, and it carries on on a fresh compile. References: the byte-level demo
tokenizer, llguidance's lexer limit lowered so that one reply fills it."""

from __future__ import annotations

import time

import pytest
import torch

from dayzero.chat.grammar import json_grammar
from dayzero.completion import Completion
from dayzero.guided import GRAMMAR_FAILED, Grammar, GrammarFailed, LexerFilled
from dayzero.params import SamplingParams

from .conftest import AB_PATTERN, few_lexer_states, fill_lexer
from .test_guided import VOCAB, _fresh_codec


def _ready(grammars, lark: str) -> None:
    """Until ``lark``'s fresh compile (in a thread) is done."""
    deadline = time.monotonic() + 60
    while grammars.compiled(lark) is None:
        assert time.monotonic() < deadline, "the grammar never compiled"
        time.sleep(0.01)


def test_a_step_failing_at_one_token_on_two_compiles_others_filled_is_its_own(monkeypatch):
    """Each fresh compile its held step renews onto, others' replies fill first (K rows held at once
    renew onto one compile in turn): the first such failure is ``LexerFilled`` (retired, another
    compile), the second at the same token its schema's. Its waits are bounded: 2 compiles, not one
    per other reply."""
    few_lexer_states(monkeypatch, 3_000)
    codec, lark = _fresh_codec(), json_grammar(AB_PATTERN)
    fill_lexer(codec.grammars, lark)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, grammar=Grammar(lark))
    completion, logits = Completion(codec, params, (1,), 4, 4096), torch.Generator().manual_seed(0)
    with pytest.raises(LexerFilled):
        for _ in range(40):
            completion.next(torch.randn(VOCAB, generator=logits))
    at, failures = completion.count, []
    for _ in range(2):
        _ready(codec.grammars, lark)
        fill_lexer(codec.grammars, lark)  # (other rows renewed onto it first, their replies in its lexer)
        with pytest.raises(GrammarFailed) as failed:
            completion.resume()
        failures.append((type(failed.value), failed.value.code, completion.count))
    assert failures == [(LexerFilled, GRAMMAR_FAILED, at), (GrammarFailed, GRAMMAR_FAILED, at)]
