"""A grammar's compile shares one lexer among its requests' matchers (llguidance's ``deep_copy``),
whose states every reply grows: once replies filled it, the request meeting the full lexer failed
(``grammar_failed``, blamed on its schema), and the compile was retired for the next. That request
now carries on: its row steps no further till a fresh compile (off the loop) is ready, its tokens
replayed into it, its held step sampled from the same logits. The loops run in-process on a real
Redis, a real runtime and llguidance, its lexer limit lowered so that a few replies fill it."""

from __future__ import annotations

import re
import time

import pytest

from dayzero.chat.grammar import json_grammar
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from ..conftest import AB_PATTERN, few_lexer_states
from .conftest import prompt_ids, recording, run_jobs


@pytest.mark.parametrize(
    ("count", "states", "tokens"),
    [
        (12, 400, 48),
        # each reply alone fits a fresh lexer of 300 states (filled300-15's writes none full), but a held
        # row renewing onto a compile others copied (and grew) meanwhile failed there as its schema's
        (16, 300, 64),
    ],
)
def test_requests_meeting_a_full_lexer_carry_on_on_a_fresh_compile(
    demo_dir, redis_url, monkeypatch, count, states, tokens
):
    few_lexer_states(monkeypatch, states)
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, lark = Lifecycle.connect(redis_url), json_grammar(AB_PATTERN)
    requests = [
        GenerationRequest(
            request_id=f"filled{states}-{i}",  # (each case its own streams)
            prompt_ids=tuple(prompt_ids(i)),
            sampling=SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, grammar=Grammar(lark)),
            created=time.time(),
        )
        for i in range(count)
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    prefill = Runtime.load(settings, "prefill-filled@test", "prefill", False)
    run_jobs(PrefillLoop(prefill, recording(sent)), [PrefillJob(request=r) for r in requests])
    decode = Runtime.load(settings, "decode-filled@test", "decode", False)
    grammars, retired = decode.codec.grammars, []
    retire = grammars.retire
    monkeypatch.setattr(grammars, "retire", lambda lark, compiled: retired.append(compiled) or retire(lark, compiled))
    run_jobs(DecodeLoop(decode), sent)
    assert retired, "no reply filled the lexer"
    for request in requests:
        rid, eos = request.request_id, decode.model.cfg.eos_token_ids
        text = decode.codec.decode_all([t for t in store.streamed_tokens(rid) if t not in eos])
        end = store.done(rid)
        assert end in ("length", "stop"), (rid, end, text)
        assert re.fullmatch(r'"[ab]*' if end == "length" else f'"{AB_PATTERN["pattern"][1:-1]}"', text), (end, text)
    assert decode.stats.snapshot()["counters"].get("grammar_failures") == 0
