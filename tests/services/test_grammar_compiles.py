"""A request's grammar compiles off the serving loops, against a real Redis and real loops: llguidance
takes seconds for a schema of thousands of properties (bench/guided.py), and that compile, run on
the loop, held every other request of the worker for as long. Here the compile is held open by the
test (the real llguidance compile runs once released): the others must go on meanwhile."""

from __future__ import annotations

import dataclasses
import threading
import time

import llguidance
import pytest

from dayzero.grammars import Grammars
from dayzero.params import Grammar, SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.records import Token
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from ..test_grammars import _counting
from .conftest import recording, run_jobs
from .prefill_jobs import handed_off

GRAMMAR = Grammar("start: /(.|\\n)*/")  # any text: what the demo model writes holds


@pytest.fixture
def held_compile(monkeypatch) -> threading.Event:
    """GRAMMAR's compile waits (up to 10 s) until the returned event is set."""
    release, real = threading.Event(), llguidance.LLMatcher

    def compiling(tokenizer, lark, **kwargs):
        if lark == GRAMMAR.lark:
            release.wait(10)
        return real(tokenizer, lark, **kwargs)

    monkeypatch.setattr(llguidance, "LLMatcher", compiling)
    return release


def _guided(request: GenerationRequest) -> GenerationRequest:
    return request.model_copy(update={"sampling": dataclasses.replace(request.sampling, grammar=GRAMMAR)})


def _iterate(loop, until, iterations: int = 400) -> None:
    for _ in range(iterations):
        if until():
            return
        loop._iteration()


def test_decode_steps_the_batch_while_a_requests_grammar_compiles(demo_dir, redis_url, held_compile):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("plain", "guided"), max_tokens=4)
    jobs = {job.request.request_id: job for job in sent}
    jobs["guided"] = jobs["guided"].model_copy(update={"request": _guided(jobs["guided"].request)})
    runtime = Runtime.load(settings, "decode8@test", "decode", False)
    loop = DecodeLoop(runtime)
    tickets = {rid: loop.intake.submit(job) for rid, job in jobs.items()}
    _iterate(loop, tickets["plain"].done.is_set)
    assert store.done("plain") == "length" and len(store.streamed_tokens("plain")) == 4
    assert not tickets["guided"].done.is_set() and len(store.streamed_tokens("guided")) == 1  # prefill's only
    assert "guided" not in runtime.pools.sequences  # no blocks held while it waits
    held_compile.set()
    _iterate(loop, tickets["guided"].done.is_set)
    assert store.done("guided") == "length" and len(store.streamed_tokens("guided")) == 4
    assert runtime.pools.sequences == {}
    runtime.close()


def test_prefill_serves_the_others_while_a_requests_grammar_compiles(demo_dir, redis_url, held_compile):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    store, sent = Lifecycle.connect(redis_url), []
    runtime = Runtime.load(settings, "prefill8@test", "prefill", False)
    loop = PrefillLoop(runtime, recording(sent))
    tickets = {}
    for rid in ("guided2", "plain2"):  # the guided one first: it would be emitted first
        sampling = SamplingParams(max_tokens=4)
        request = GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6), sampling=sampling, created=time.time())
        request = _guided(request) if rid == "guided2" else request
        store.admit(request, [], "", 60)
        tickets[rid] = loop.intake.submit(PrefillJob(request=request))
    _iterate(loop, tickets["plain2"].done.is_set)
    assert [job.request.request_id for job in sent] == ["plain2"] and len(store.streamed_tokens("plain2")) == 1
    assert not tickets["guided2"].done.is_set() and store.streamed_tokens("guided2") == []
    held_compile.set()
    _iterate(loop, tickets["guided2"].done.is_set)
    assert [job.request.request_id for job in sent] == ["plain2", "guided2"]
    assert len(store.streamed_tokens("guided2")) == 1
    runtime.close()


def test_a_guided_re_run_is_prefilled_and_handed_off_without_its_grammar(demo_dir, redis_url, held_compile):
    """A re-run samples nothing in prefill: decode replays the tokens it streamed (its grammar's state
    among them) and feeds the last. Its prefill waited for a compile it never used (held here: never
    handed off), then decode compiled it again."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    store, sent, rid = Lifecycle.connect(redis_url), [], "guided-rerun"
    runtime = Runtime.load(settings, "prefill-guided-rerun@test", "prefill", False)
    loop = PrefillLoop(runtime, recording(sent))
    sampling = SamplingParams(max_tokens=4)
    request = _guided(GenerationRequest(request_id=rid, prompt_ids=(0, 5, 6), sampling=sampling, created=time.time()))
    store.admit(request, [], "", 60)
    store.r.set(key("attempt", rid), 1)  # re-run after its decode worker died, a token streamed
    store.append([Token(rid, 0, 7, "a")], {rid: 1}, "")
    try:
        ticket = loop.intake.submit(PrefillJob(request=request, generated=(7,), attempt=1))
        _iterate(loop, ticket.done.is_set, 40)
        assert [(job.attempt, job.generated) for job in sent] == [(1, (7,))]
        assert ticket.grammar is None and store.owner(rid) == "handoff"
    finally:
        held_compile.set()
        runtime.close()


def _tiny_cache(runtime: Runtime, monkeypatch) -> None:
    """The runtime's grammars cache holds one compiled grammar (as 256 do with more waiting in one worker)."""
    monkeypatch.setitem(vars(runtime.codec), "grammars", Grammars(runtime.codec.guidance, cached=1, most=1))


def _two_grammars(request: GenerationRequest, i: int) -> GenerationRequest:
    sampling = dataclasses.replace(request.sampling, grammar=Grammar(f"{GRAMMAR.lark}\n// grammar {i}\n"))
    return request.model_copy(update={"sampling": sampling})


def test_a_ready_grammar_the_cache_dropped_is_not_compiled_again_on_the_prefill_loop(demo_dir, redis_url, monkeypatch):
    """Two requests' grammars compile; asking the second's drops the first's from a full cache. Its
    request, told its grammar was ready, holds it: its completion (built as its first token is
    sampled, its blocks held, the batch waiting) compiled it again, on the loop."""
    compiled = _counting(monkeypatch)
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    runtime, store, sent = (
        Runtime.load(settings, "prefill-dropped@test", "prefill", False),
        Lifecycle.connect(redis_url),
        [],
    )
    _tiny_cache(runtime, monkeypatch)
    jobs = []
    for i in range(2):
        sampling = SamplingParams(max_tokens=4)
        request = GenerationRequest(
            request_id=f"dropped{i}", prompt_ids=(0, 5, 6), sampling=sampling, created=time.time()
        )
        store.admit(_two_grammars(request, i), [], "", 60)
        jobs.append(PrefillJob(request=_two_grammars(request, i)))
    run_jobs(PrefillLoop(runtime, recording(sent)), jobs)
    assert sorted(job.request.request_id for job in sent) == ["dropped0", "dropped1"]
    assert sorted(compiled) == sorted(job.request.sampling.grammar.lark for job in jobs)  # each once
    runtime.close()


def test_a_ready_grammar_the_cache_dropped_is_not_compiled_again_on_the_decode_loop(demo_dir, redis_url, monkeypatch):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("decode-dropped0", "decode-dropped1"), max_tokens=4)
    jobs = [job.model_copy(update={"request": _two_grammars(job.request, i)}) for i, job in enumerate(sent)]
    compiled = _counting(monkeypatch)
    runtime = Runtime.load(settings, "decode-dropped@test", "decode", False)
    _tiny_cache(runtime, monkeypatch)
    run_jobs(DecodeLoop(runtime), jobs)
    assert [store.done(job.request.request_id) for job in jobs] == ["length", "length"]
    assert sorted(compiled) == sorted(job.request.sampling.grammar.lark for job in jobs)  # each once
    runtime.close()
