"""Whose a full lexer is (``Guide.renew``): a compile's matchers share its lexer, so a failure there
is the request's own only on a compile no other matcher was copied from (or the second time at one
token): else ``LexerFilled``, and it carries on on a fresh compile. References: the byte-level demo
tokenizer, llguidance's lexer limit lowered so that one reply fills it."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from opentelemetry.trace import INVALID_SPAN

from dayzero.chat.grammar import json_grammar
from dayzero.completion import Completion
from dayzero.grammars import Grammars
from dayzero.guided import GRAMMAR_FAILED, Grammar, GrammarFailed, LexerFilled
from dayzero.params import SamplingParams
from dayzero.serving.active import Active
from dayzero.serving.intake import Ticket
from dayzero.serving.runtime import Runtime

from .grammar_cases import AB_PATTERN, few_lexer_states, fill_lexer, ready_compile, seen_ready
from .test_guided import VOCAB, _fresh_codec


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
        compiled = ready_compile(codec.grammars, lark)
        fill_lexer(codec.grammars, lark)  # (other rows renewed onto it first, their replies in its lexer)
        with pytest.raises(GrammarFailed) as failed:
            completion.resume(compiled)
        failures.append((type(failed.value), failed.value.code, completion.count))
    assert failures == [(LexerFilled, GRAMMAR_FAILED, at), (GrammarFailed, GRAMMAR_FAILED, at)]


def test_a_decode_row_renews_on_the_compile_its_ticket_holds_not_the_caches(monkeypatch):
    """A decode row whose replay met a full lexer renews on the fresh compile its ticket holds once
    seen ready (``Runtime.grammar_ready``, as prefill's first token does). It asked the grammar
    cache again instead: one that dropped that compile meanwhile (``most`` other grammars used) and
    compiled the grammar anew for other rows, whose replies filled its lexer, gave the row that one:
    its replay failed there too (``LexerFilled``), and the row waited for yet another compile."""
    few_lexer_states(monkeypatch, 3_000)
    lark = json_grammar(AB_PATTERN)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, grammar=Grammar(lark))
    first = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))  # [V]: prefill's logits
    streamed = (Completion(_fresh_codec(), params, (1,), 4, 4096).next(first).token,)
    codec = _fresh_codec()
    codec.grammars = grammars = Grammars(codec.guidance, cached=1, most=1)
    fill_lexer(grammars, lark)
    request = SimpleNamespace(request_id="held", sampling=params)
    ticket = Ticket(SimpleNamespace(request=request), grammar=ready_compile(grammars, lark))
    row = Active(ticket, Completion(codec, params, (1,), 4, 4096, streamed), streamed[-1], INVALID_SPAN)
    assert row.completion.waiting  # (its replay met the full lexer: that compile retired)
    runtime = SimpleNamespace(codec=codec)
    runtime.grammar_ready = partial(Runtime.grammar_ready, runtime)
    seen_ready(runtime, ticket)  # the loop sees a fresh compile ready: the ticket holds it
    ready_compile(grammars, json_grammar({"type": "string"}))  # (another grammar used: the cache drops it)
    fill_lexer(grammars, lark)  # (compiled anew, others' replies fill that one)
    row.resume(runtime, 1)
    assert not row.completion.waiting and row.end is None
    logits = torch.Generator().manual_seed(0)
    written = [row.completion.next(torch.randn(VOCAB, generator=logits)).token for _ in range(8)]
    unfilled = Completion(_fresh_codec(), params, (1,), 4, 4096, streamed)
    logits = torch.Generator().manual_seed(0)
    assert written == [unfilled.next(torch.randn(VOCAB, generator=logits)).token for _ in range(8)]
