"""Compiled grammars: each compiled once per process (by its text), every matcher its own copy."""

from __future__ import annotations

import threading

import llguidance

from dayzero.grammars import Grammars


def _counting(monkeypatch) -> list[str]:
    """The grammars llguidance compiles, in order."""
    compiled, real = [], llguidance.LLMatcher
    monkeypatch.setattr(llguidance, "LLMatcher", lambda tok, lark, **kw: compiled.append(lark) or real(tok, lark, **kw))
    return compiled


def test_a_grammar_compiles_once_and_each_matcher_is_its_own(codec, monkeypatch):
    compiled = _counting(monkeypatch)
    grammars = Grammars(codec.guidance, cached=2, kept_s=0)
    first, second = grammars.matcher('start: "ab"'), grammars.matcher('start: "ab"')
    assert compiled == ['start: "ab"'] and grammars.ready('start: "ab"')
    assert first.consume_tokens(codec.encode("ab")[1:]) and first.is_accepting()
    assert not second.is_accepting()  # untouched by the other's tokens
    grammars.matcher('start: "c"')
    grammars.matcher('start: "d"')  # the least recently used ("ab") goes
    grammars.matcher('start: "ab"')
    assert compiled == ['start: "ab"', 'start: "c"', 'start: "d"', 'start: "ab"']


def test_a_burst_of_other_grammars_keeps_one_used_lately(codec, monkeypatch):
    """A request found its grammar ready, then waits for its step (or its prefill) while other
    requests bring more new grammars than are cached: its own must still be there (else its
    completion compiles it again, on the serving loop)."""
    compiled = _counting(monkeypatch)
    grammars = Grammars(codec.guidance, cached=2)
    grammars.matcher('start: "ab"')
    for i in range(4):
        grammars.ready(f'start: "x{i}"')  # (their compiles start)
    grammars.matcher('start: "ab"')
    assert compiled.count('start: "ab"') == 1


def test_a_refused_grammar_gives_a_matcher_in_its_error_state(codec):
    matcher = Grammars(codec.guidance).matcher("start: greeting\n")
    assert matcher.is_error() and "greeting" in matcher.get_error()


def test_grammars_used_lately_are_kept_up_to_a_bound(codec, monkeypatch):
    """However recently used, no more than ``most`` compiled grammars are held (a flood of distinct
    schemas would otherwise hold them all for ``kept_s``): the least recently used goes first."""
    compiled = _counting(monkeypatch)
    grammars = Grammars(codec.guidance, cached=1, most=2)
    for name in ("a", "b", "c"):
        grammars.matcher(f'start: "{name}"')
    grammars.matcher('start: "c"')
    grammars.matcher('start: "b"')
    assert compiled == ['start: "a"', 'start: "b"', 'start: "c"']
    grammars.matcher('start: "a"')  # went when "c" came
    assert compiled[-1] == 'start: "a"' and len(compiled) == 4


def test_more_grammars_compiling_than_kept_each_compiles_once(codec, monkeypatch):
    """A serving loop asks ``ready`` of each waiting request's grammar in turn, every iteration. With
    more distinct grammars compiling than ``most``, each call dropped the oldest, a compile the next
    call asked for, which began again: none ever ready, a thread more per call."""
    release, compiled, real = threading.Event(), [], llguidance.LLMatcher

    def held(tok, lark, **kw):
        compiled.append(lark)
        release.wait()
        return real(tok, lark, **kw)

    monkeypatch.setattr(llguidance, "LLMatcher", held)
    grammars, names = Grammars(codec.guidance, cached=1, most=2), [f'start: "{n}"' for n in "abc"]
    for _ in range(3):  # three iterations of a loop, its three requests waiting
        assert not any([grammars.ready(lark) for lark in names])
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "grammar"]:
        thread.join()
    assert sorted(compiled) == names  # (not a, b, c, a, b, c, ...: nine compiles)
    assert grammars.ready(names[-1])


def test_a_grammar_compiled_but_not_seen_yet_stays_for_its_waiter(codec, monkeypatch):
    """A serving loop asks ``ready`` of each waiting request's grammar in turn. One that finished after
    its own request's ask was dropped by the next request's (more than ``most`` held) before its waiter
    saw it done: the waiter's next ask compiled it again (with more than ``most`` waiting, again and
    again)."""
    release, compiled, real = threading.Event(), [], llguidance.LLMatcher

    def held(tok, lark, **kw):
        compiled.append(lark)
        if lark == 'start: "a"':
            release.wait()
        return real(tok, lark, **kw)

    monkeypatch.setattr(llguidance, "LLMatcher", held)
    grammars = Grammars(codec.guidance, cached=1, most=1)
    assert not grammars.ready('start: "a"')
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "grammar"]:
        thread.join()
    grammars.ready('start: "b"')  # (the next request's ask: "a" is done, its waiter has not seen it)
    assert grammars.ready('start: "a"') and compiled.count('start: "a"') == 1
