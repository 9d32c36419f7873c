"""Constrained decoding masks: one batch call, rows without a grammar untouched, the grammar's
state following each accepted token (references: the tokenizer's own token strings)."""

from __future__ import annotations

import json
import random
import re

import jsonschema_rs
import pytest
import torch

from dayzero.chat.grammar import json_grammar
from dayzero.completion import Completion
from dayzero.grammars import Grammars
from dayzero.guided import GRAMMAR_FAILED, Grammar, GrammarFailed, Guide, allowed_logits
from dayzero.params import SamplingParams

from .conftest import build_tokenizer
from .grammar_cases import (
    AB_PATTERN,
    FAILING_LATE,
    LATE_PATTERN,
    few_lexer_states,
    fill_lexer,
    ready_compile,
    seen_ready,
)

VOCAB = 512  # the model's rows (the demo tokenizer has fewer tokens: the rest is padding)


def _strings(codec) -> dict[int, str]:
    return {i: codec.decode_all([i]) for i in range(codec.vocab_size)}


def test_a_batch_masks_only_its_constrained_rows(codec):
    guide = Guide(codec.grammars, Grammar("start: /[a-c][0-9]*/"))
    logits = torch.randn(3, VOCAB)
    out = allowed_logits(logits, [None, guide, None], eos=1)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    allowed = {i for i in range(VOCAB) if out[1, i] > float("-inf")}
    want = {i for i, s in _strings(codec).items() if re.fullmatch("[a-c][0-9]*", s)}
    assert allowed == want and len(want) > 1
    assert torch.equal(out[1][sorted(allowed)], logits[1][sorted(allowed)])  # allowed logits unchanged


def test_the_state_follows_accepted_tokens_and_ends_with_eos(codec):
    guide = Guide(codec.grammars, Grammar('start: "fox"'))
    text = ""
    for _ in range(8):
        row = allowed_logits(torch.zeros(1, VOCAB), [guide], eos=1)[0]
        token = int(torch.nonzero(row > float("-inf"))[-1])  # the highest allowed id, a fixed choice
        if token == 1:
            break
        text += codec.decode_all([token])
        guide.accept(token)
    assert text == "fox" and token == 1  # the grammar complete: only EOS may follow


def test_a_grammar_after_a_token_leaves_the_text_before_it_free_but_unended(codec):
    end_think = codec.token_id("</think>")
    guide = Guide(codec.grammars, Grammar('start: "ok"', after=end_think))
    logits = torch.randn(1, VOCAB)
    before = allowed_logits(logits, [guide], eos=1)
    assert before[0, 1] == float("-inf") and torch.equal(before[0, 2:], logits[0, 2:]) and before[0, 0] == logits[0, 0]
    guide.accept(codec.token_id("The"))
    guide.accept(end_think)
    allowed = allowed_logits(logits, [guide], eos=1)[0] > float("-inf")
    assert {codec.decode_all([int(i)]) for i in torch.nonzero(allowed)} <= {"o", "ok"}


def test_a_guide_looks_its_grammar_up_once(codec, monkeypatch):
    """(It looked it up twice: for its matcher, then for the compile it retires when its lexer fills.)"""
    grammars, looked_up = Grammars(codec.guidance), []
    compiling = grammars.compiling
    monkeypatch.setattr(grammars, "compiling", lambda lark: looked_up.append(lark) or compiling(lark))
    Guide(grammars, Grammar('start: "ok"'))
    assert looked_up == ['start: "ok"']


def test_an_invalid_grammar_is_named_without_the_grammar_text(codec):
    with pytest.raises(ValueError) as refused:
        Guide(codec.grammars, Grammar("start: greeting\n"))
    assert str(refused.value) == 'invalid grammar: unknown name: "greeting"'


@pytest.mark.parametrize("schema", FAILING_LATE)
def test_a_grammar_failing_mid_reply_fails_the_request_rather_than_end_it_with_stop(codec, schema):
    """Each grammar fails after its first token (past the parser's limits; the gateway refuses both
    now, but a reply may still walk into a limit later): the end its empty mask forces is not an
    answer, and must never come back as "stop" with text the schema refuses."""
    validator = jsonschema_rs.validator_for(schema)
    for seed in range(4):
        params = SamplingParams(max_tokens=24, temperature=1.0, seed=seed, grammar=Grammar(json_grammar(schema)))
        completion = Completion(codec, params, (1,), 4, 4096)
        text, logits = "", torch.Generator().manual_seed(seed)
        with pytest.raises(GrammarFailed, match="its grammar failed mid-reply: "):
            while not (step := completion.next(torch.randn(VOCAB, generator=logits))).finish_reason:
                text += step.text
            text += step.text
            assert step.finish_reason != "stop" or validator.is_valid(json.loads(text)), (text, step)


def test_a_grammar_failing_on_a_token_its_mask_allowed_fails_on_it_as_the_schemas(codec):
    """The gateway's check passes it (the bytes it walks end before the string); the lexer then
    fails on a token the mask allowed (as the string's lexeme comes in reach): the token was streamed,
    then the end the empty mask forced failed the request as a bare 500 "sampling failed:
    GrammarFailed". It fails on that token now (not streamed), as the schema's failure (the gateway's
    400), naming llguidance's why."""
    from dayzero.chat.grammar import schema_problem

    assert schema_problem(LATE_PATTERN) is None
    params = SamplingParams(max_tokens=400, temperature=1.0, seed=0, grammar=Grammar(json_grammar(LATE_PATTERN)))
    completion, text, logits = Completion(codec, params, (1,), 4, 4096), "", torch.Generator().manual_seed(0)
    with pytest.raises(GrammarFailed) as failed:
        while not (step := completion.next(torch.randn(VOCAB, generator=logits))).finish_reason:
            assert not completion.guide.matcher.is_error(), text + step.text  # (a token it failed on: not streamed)
            text += step.text
    assert '"b11": ' in text and failed.value.code == GRAMMAR_FAILED  # (past the bytes the check walks)
    assert str(failed.value) == "its grammar failed mid-reply: lexer error: too many expressions constructed"
    assert completion.guide.matcher.is_error()


def test_a_token_outside_the_mask_is_the_servers_failure_not_the_schemas(codec):
    guide = Guide(codec.grammars, Grammar('start: "ok"'))
    with pytest.raises(GrammarFailed, match="^the grammar refused the token sampled: .*satisfy the grammar") as failed:
        guide.accept(codec.token_id("The"))
    assert failed.value.code == ""


def test_the_cpu_and_the_device_ways_of_masking_agree(codec):
    """float32 logits on a CPU are masked by numpy, others (bf16 here, any on a GPU) by torch."""
    guides = [
        Guide(codec.grammars, Grammar("start: /[a-c][0-9]*/")),
        None,
        Guide(codec.grammars, Grammar('start: "ok"')),
    ]
    for token in codec.encode("ok")[1:]:
        guides[2].accept(token)  # complete: only EOS may follow
    logits = torch.randn(3, VOCAB)
    by_numpy, by_torch = allowed_logits(logits, guides, eos=1), allowed_logits(logits.bfloat16(), guides, eos=1)
    assert torch.equal(by_numpy == float("-inf"), by_torch == float("-inf"))
    assert torch.equal(by_numpy[1], logits[1]) and (by_numpy[2] > float("-inf")).nonzero().flatten().tolist() == [1]


def test_a_grammar_whose_lexer_replies_filled_is_compiled_anew(codec, monkeypatch):
    """Every matcher of a compiled grammar shares its lexer (llguidance's ``deep_copy``), whose states
    each reply grows: a schema each of whose replies a fresh compile writes whole failed every
    request once many had filled it (a ``[ab]*a[ab]{20}`` reply of 300 characters, the 83rd request
    under the default limits, byte vocabulary), while the grammar stayed cached. The request that
    finds it full retires the compile: the next one's matcher is a fresh compile's."""
    from dayzero.guided import fill_masks

    few_lexer_states(monkeypatch, 3_000)
    grammars, lark, texts = Grammars(codec.guidance), json_grammar(AB_PATTERN), random.Random(0)

    def write(text: str, compiled: Grammars = grammars) -> None:
        guide = Guide(compiled, Grammar(lark))
        for token in codec.encode(json.dumps(text + "a" + "b" * 20))[1:]:
            fill_masks([guide])
            guide.accept(token)

    served = 0
    while served < 200:
        try:
            write(text := "".join(texts.choice("ab") for _ in range(100)))
        except GrammarFailed as failed:
            assert "lexer error: too many states" in str(failed)
            write(text, Grammars(codec.guidance))  # (alone on a compile of its own: written whole)
            break
        served += 1
    else:
        raise AssertionError("no reply filled the shared lexer")
    assert served > 0  # (the first reply, alone on the compile, was written whole)
    write("ab" * 50)  # the next request: a fresh compile's lexer


def test_a_completion_meeting_a_full_lexer_carries_on_as_on_a_compile_of_its_own(monkeypatch):
    """Its compile's lexer full (other replies filled it), the completion's step fails (the mask
    computed on it: the end it forced), and the request failed as its schema's. Now the step is held
    (``LexerFilled``) and sampled again from the same logits on a fresh compile once ready (off the
    caller's thread): the tokens are those it writes on an unfilled compile, none lost."""
    from dayzero.guided import LexerFilled
    from dayzero.tokenizer import TextCodec

    few_lexer_states(monkeypatch, 3_000)
    lark = json_grammar(AB_PATTERN)

    def write(codec: TextCodec) -> tuple[list[int], int]:
        """The completion's tokens, and how many of its steps were held."""
        params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, grammar=Grammar(lark))
        completion, logits = Completion(codec, params, (1,), 4, 4096), torch.Generator().manual_seed(0)
        tokens, held, step = [], 0, None
        while step is None or not step.finish_reason:
            try:
                step = completion.next(torch.randn(VOCAB, generator=logits))
            except LexerFilled:
                held += 1
                step = completion.resume(ready_compile(codec.grammars, lark))  # (its fresh compile, in a thread)
            tokens.append(step.token)
        return tokens, held

    filled = _fresh_codec()
    fill_lexer(filled.grammars, lark)
    (carried_on, held), (unfilled, _) = write(filled), write(_fresh_codec())
    assert held == 1 and carried_on == unfilled


def _fresh_codec():
    """A codec with grammars of its own."""
    from dayzero.tokenizer import TextCodec

    return TextCodec(build_tokenizer(512), tokens={"eos_token": "<｜end▁of▁sentence｜>"})


def test_a_completion_rebuilt_on_a_full_lexer_waits_for_a_fresh_compile_then_carries_on(monkeypatch):
    """Decode rebuilds a request's completion from the tokens it streamed: its compile's lexer full,
    the replay failed the request as its schema's (a 400 at admission). Now the completion waits
    (``waiting``; ``next`` raises ``LexerFilled``, where nothing renews it: prefill's re-run) and,
    once ``resume`` took a fresh compile, writes what one rebuilt on an unfilled compile writes."""
    from dayzero.guided import LexerFilled

    few_lexer_states(monkeypatch, 3_000)
    lark = json_grammar(AB_PATTERN)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, grammar=Grammar(lark))
    first = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))  # [V]: prefill's logits
    streamed = [Completion(_fresh_codec(), params, (1,), 4, 4096).next(first).token]

    def rest(completion: Completion) -> list[int]:
        logits, tokens = torch.Generator().manual_seed(0), [-1]
        while completion.remaining() > 0 and tokens[-1] != 1:
            tokens.append(completion.next(torch.randn(VOCAB, generator=logits)).token)
        return tokens[1:]

    filled = _fresh_codec()
    fill_lexer(filled.grammars, lark)
    rebuilt = Completion(filled, params, (1,), 4, 4096, tuple(streamed))
    assert rebuilt.waiting and rebuilt.count == 1 and rebuilt.held is None
    with pytest.raises(LexerFilled):
        rebuilt.next(first)
    assert rebuilt.resume(ready_compile(filled.grammars, lark)) is None  # (no step held: it steps again)
    assert not rebuilt.waiting
    assert rest(rebuilt) == rest(Completion(_fresh_codec(), params, (1,), 4, 4096, tuple(streamed)))


def test_a_replay_renewed_with_no_step_held_is_not_blamed_for_a_lexer_others_fill(monkeypatch):
    """A completion rebuilt on a full lexer renews with no step held: its next token is first tried
    at its next step, after the rows renewed beside it copied the fresh compile and grew its lexer
    (their replays, their masks). Filled so, its step failed the request as its schema's
    (``GrammarFailed``, a 400), where a held step's retry, taken in ``resume`` before others copy,
    is ``LexerFilled``: it is held too, and carries on on a fresh compile."""
    from dayzero.guided import LexerFilled

    few_lexer_states(monkeypatch, 3_000)
    lark = json_grammar(AB_PATTERN)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, grammar=Grammar(lark))
    first = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    streamed = (Completion(_fresh_codec(), params, (1,), 4, 4096).next(first).token,)
    filled = _fresh_codec()
    fill_lexer(filled.grammars, lark)
    rebuilt = Completion(filled, params, (1,), 4, 4096, streamed)
    assert rebuilt.resume(ready_compile(filled.grammars, lark)) is None and not rebuilt.waiting
    fill_lexer(filled.grammars, lark)  # (the rows renewed beside it, on the same fresh compile)
    logits = torch.Generator().manual_seed(0)
    with pytest.raises(LexerFilled):
        for _ in range(40):
            rebuilt.next(torch.randn(VOCAB, generator=logits))
    step = rebuilt.resume(ready_compile(filled.grammars, lark))
    assert rebuilt.count == 2 and step.token != 1


def test_a_request_holding_a_retired_compile_takes_a_fresh_one(codec):
    """A request waiting for a place holds its grammar's compile (``Runtime.grammar_ready``): one
    retired meanwhile, its lexer filled by another request's reply, failed each such request at the
    first state its reply needed. Ready again, it holds the fresh compile."""
    from types import SimpleNamespace

    grammars, lark = Grammars(codec.guidance), json_grammar({"type": "string"})
    runtime = SimpleNamespace(codec=SimpleNamespace(grammars=grammars, has_tokenizer=True))
    request = SimpleNamespace(sampling=SimpleNamespace(grammar=Grammar(lark)))
    ticket = SimpleNamespace(job=SimpleNamespace(request=request), grammar=None)

    seen_ready(runtime, ticket)
    held = ticket.grammar
    grammars.retire(lark, held)  # (another request's matcher of it failed on its lexer)
    seen_ready(runtime, ticket)
    assert ticket.grammar is not held and ticket.grammar is grammars.compiled(lark)
