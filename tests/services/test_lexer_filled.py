"""A grammar's compile shares one lexer among its requests' matchers (llguidance's ``deep_copy``),
whose states every reply grows: once replies filled it, the request meeting the full lexer failed
(``grammar_failed``, blamed on its schema), and the compile was retired for the next. That request
now carries on: its row steps no further till a fresh compile (off the loop) is ready, its tokens
replayed into it, its held step sampled from the same logits. The loops run in-process on a real
Redis, a real runtime and llguidance, its lexer limit lowered so that a few replies fill it."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from dayzero.chat.grammar import json_grammar
from dayzero.params import Grammar, SamplingParams
from dayzero.serving import prefill_loop
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from ..grammar_cases import AB_PATTERN, few_lexer_states, fill_lexer
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


def test_a_reply_that_fills_a_fresh_lexer_by_itself_after_its_replay_fails_as_its_schemas(
    demo_dir, redis_url, monkeypatch, caplog
):
    """Decode's rebuild of prefill's first token meets a lexer others filled and waits for a fresh
    compile; its reply then fills a fresh lexer of 300 states by itself (its quote kept out by
    ``logit_bias``: no reply of 400 characters fits). That is the schema's failure (``grammar_failed``,
    a 400), counted as a grammar failure and logged at INFO, its end next to its last streamed token.
    It was blamed on a shared lexer (``LexerFilled``) unless it failed at the very token it renewed
    at: each fresh compile, filled by this reply alone, was retired for another that let ~40 more
    tokens through (11 compiles, the row waiting for each)."""
    caplog.set_level(logging.INFO, logger="dayzero.decode")
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, lark, rid = Lifecycle.connect(redis_url), json_grammar(AB_PATTERN), "filled-alone"
    decode = Runtime.load(settings, "decode-alone@test", "decode", False)
    (quote,) = decode.codec.grammars.tokenizer.tokenize_str('"')
    sampling = SamplingParams(
        max_tokens=400, temperature=1.0, seed=0, grammar=Grammar(lark), logit_bias=((quote, -100.0),)
    )
    request = GenerationRequest(request_id=rid, prompt_ids=tuple(prompt_ids(4)), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    run_jobs(
        PrefillLoop(Runtime.load(settings, "prefill-alone@test", "prefill", False), recording(sent)),
        [PrefillJob(request=request)],
    )
    few_lexer_states(monkeypatch, 300)
    grammars, retired = decode.codec.grammars, []
    retire = grammars.retire
    monkeypatch.setattr(grammars, "retire", lambda lark, compiled: retired.append(compiled) or retire(lark, compiled))
    fill_lexer(grammars, lark)
    run_jobs(DecodeLoop(decode), sent)
    (_, last), *_ = store.r.xrevrange(f"dz:tokens:{rid}", count=1)
    streamed = store.streamed_tokens(rid)
    text = decode.codec.decode_all(streamed)
    assert (store.done(rid), last.get(b"c")) == ("error", b"grammar_failed"), (last, text)
    assert last[b"e"].decode().startswith("its grammar failed mid-reply: lexer error: too many states"), last
    assert int(last[b"i"]) == len(streamed) and 20 < len(streamed) < 400, (last, len(streamed))
    assert re.fullmatch(r'"[ab]*', text), text
    assert len(retired) == 2, "the compile others filled, then the fresh one its reply filled"
    snapshot = decode.stats.snapshot()
    assert (snapshot["counters"].get("grammar_failures"), snapshot["failures"].get("decode", 0)) == (1, 0), snapshot
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and all(r.levelno == logging.INFO for r in logged), [(r.levelname, r.getMessage()) for r in logged]


def test_prefill_meeting_a_lexer_others_filled_carries_on_on_a_fresh_compile(demo_dir, redis_url, monkeypatch):
    """A new request's first sample met its grammar's compile, whose lexer other replies filled: it
    ended ``grammar_failed`` in prefill (a 400 blaming a valid schema). Now it waits for a fresh
    compile, off the loop (a plain request prefilled meanwhile goes on; its lease beaten past several
    lapses), and streams what the same request streams on an unfilled compile (the same seed: the
    same tokens). (A re-run's prefill samples and replays nothing: decode replays it, as in
    test_grammar_failed's ``..._as_decode_replays_the_first_token_...``.)"""
    from .prefill_jobs import admitted

    few_lexer_states(monkeypatch, 300)
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, lark = Lifecycle.connect(redis_url), json_grammar(AB_PATTERN)
    prefill = Runtime.load(settings.model_copy(update={"lease_s": 0.3}), "prefill-refill@test", "prefill", False)
    prefill.warm_up(decode=False)  # (no kernel compile inside a lease)
    decode = Runtime.load(settings, "decode-refill@test", "decode", False)
    sampling = SamplingParams(max_tokens=40, temperature=1.0, seed=5, grammar=Grammar(lark))

    def job(rid: str) -> PrefillJob:
        request = GenerationRequest(
            request_id=rid, prompt_ids=tuple(prompt_ids(2)), sampling=sampling, created=time.time()
        )
        store.admit(request, [], "", 60)
        return PrefillJob(request=request)

    def decoded(rid: str, sent: list[DecodeJob]) -> list[int]:
        assert [job.request.request_id for job in sent] == [rid], store.stream(rid)
        run_jobs(DecodeLoop(decode), sent)
        assert store.done(rid) in ("length", "stop"), store.stream(rid)
        return store.streamed_tokens(rid)

    sent: list[DecodeJob] = []
    run_jobs(PrefillLoop(prefill, recording(sent)), [job("unfilled")])
    unfilled = decoded("unfilled", sent)
    grammars, retired, compiles = prefill.codec.grammars, [], threading.Event()
    retire, compile_ = grammars.retire, grammars._compile
    monkeypatch.setattr(grammars, "retire", lambda lark, compiled: retired.append(compiled) or retire(lark, compiled))
    monkeypatch.setattr(grammars, "_compile", lambda lark, future: compiles.wait(60) and compile_(lark, future))
    fill_lexer(grammars, lark)
    rid, sent = "filled", []
    loop, resent = PrefillLoop(prefill, recording(sent)), []
    again = loop.sender.again
    monkeypatch.setattr(loop.sender, "again", lambda tickets: resent.extend(t.job for t in tickets) or again(tickets))
    filled, beside = loop.intake.submit(job(rid)), loop.intake.submit(admitted(store, "beside"))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        assert beside.done.wait(60) and not filled.done.is_set(), store.stream(rid)  # (its compile waits)
        time.sleep(1.0)  # three leases
        assert store.owner(rid) == prefill.name and not filled.done.is_set()
        compiles.set()
        assert filled.done.wait(60)
    finally:
        loop.stop.set()
        thread.join(30)
    assert [job.request.request_id for job in resent] == [rid]  # once compiled (not each pass meanwhile)
    assert decoded(rid, [j for j in sent if j.request.request_id == rid]) == unfilled
    assert len(retired) == 1 and prefill.stats.snapshot()["counters"].get("grammar_failures") == 0
    text = decode.codec.decode_all([t for t in unfilled if t not in decode.model.cfg.eos_token_ids])
    assert re.fullmatch(r'"[ab]*"?', text), text


def test_prefill_waiting_for_a_fresh_compile_takes_the_one_it_saw_ready(demo_dir, redis_url, monkeypatch):
    """A first token waiting for a fresh compile is resent once the loop sees that compile ready (the
    ticket holds it: ``grammar_ready``). The cache may drop it before the resend takes it (more than 256
    grammars in use: others asked for in the same pass, ``compiled(arrived)``): the resend renewed from
    the cache, not the compile it was let through for, so it compiled the grammar once more, and the
    ticket, still holding a ready compile, was resent on every pass till that compile ended (a spin)."""
    few_lexer_states(monkeypatch, 300)
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, lark, rid = Lifecycle.connect(redis_url), json_grammar(AB_PATTERN), "filled-evicted"
    prefill = Runtime.load(settings, "prefill-evicted@test", "prefill", False)
    grammars = prefill.codec.grammars
    fill_lexer(grammars, lark)
    gates, compiles, compile_ = [threading.Event(), threading.Event()], [], grammars._compile

    def held(lark: str, future) -> None:  # (each fresh compile waits for its gate)
        compiles.append(lark)
        gates[len(compiles) - 1].wait(60) and compile_(lark, future)

    monkeypatch.setattr(grammars, "_compile", held)
    sampling = SamplingParams(max_tokens=40, temperature=1.0, seed=5, grammar=Grammar(lark))
    request = GenerationRequest(request_id=rid, prompt_ids=tuple(prompt_ids(2)), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    loop, resent, evicted = PrefillLoop(prefill, recording(sent)), [], []
    again, compiled = loop.sender.again, prefill_loop.compiled
    monkeypatch.setattr(loop.sender, "again", lambda tickets: resent.extend(t.job for t in tickets) or again(tickets))

    def dropped_after(tickets, runtime):  # (the cache drops it once the loop saw it ready: others asked since)
        ready = compiled(tickets, runtime)
        if not evicted and any(t.job.request.request_id == rid and loop.kept.holds(t) for t in ready):
            evicted.append(grammars._compiled.pop(lark))
        return ready

    monkeypatch.setattr(prefill_loop, "compiled", dropped_after)
    filled = loop.intake.submit(PrefillJob(request=request))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        while not compiles:  # its first sample met the full lexer: a fresh compile started
            assert not filled.done.wait(0.01), store.stream(rid)
        gates[0].set()
        for _ in range(6000):  # (till it is handed off, or a second compile starts)
            if filled.done.wait(0.01) or len(compiles) > 1:
                break
        time.sleep(0.2)  # (a second compile, held: the loop resends meanwhile)
        gates[1].set()
        assert filled.done.wait(60)
    finally:
        loop.stop.set()
        thread.join(30)
    assert evicted and store.done(rid) is None and [j.request.request_id for j in sent] == [rid], store.stream(rid)
    assert (len(compiles), [j.request.request_id for j in resent]) == (1, [rid]), (len(compiles), len(resent))
