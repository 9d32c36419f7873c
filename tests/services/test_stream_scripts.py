"""The token stream's transitions against a real Redis (stream_scripts.py through Lifecycle): only
the current run appends to a request's stream or ends it, each entry once, and the end exactly once."""

from __future__ import annotations

import pytest
import redis

from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.records import Token, decode
from dayzero.serving.scripts import Take
from dayzero.serving.stream_scripts import Settled

from .lifecycle_requests import request


def test_append_streams_each_token_once_and_reads_the_cancel_marks_it_watches(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60)
    first = [Token("t1", 0, 7, "a", logprob=-0.5, top=((7, -0.5),)), Token("t2", 0, 8, "b")]
    store.cancel("t2")
    runs = {"t1": 0, "t2": 0, "odd": 0}
    assert store.append(first, runs, "decode0", ["t1", "t2", "t3"]) == (set(), {"t2"})
    assert not store.r.exists(key("tokens", "t2"))  # cancelled, watched: nothing written
    again = [Token("t1", 0, 9, "z"), Token("t1", 1, 3, "c", "stop", usage={"n": 1})]
    assert store.append(again, runs, "decode0") == (set(), set())
    entries = store.r.xrange(key("tokens", "t1"))
    assert [decode("t1", fields) for _, fields in entries] == [first[0], Token("t1", 1, 3, "c", "stop", {"n": 1})]
    assert [entry for entry, _ in entries] == [b"1-0", b"2-0"]  # the replayed index 0 was skipped
    assert 0 < store.r.ttl(key("tokens", "t1")) <= 60
    store.r.set(key("tokens", "odd"), "not a stream")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.append([Token("odd", 0, 1, "x"), Token("t2", 0, 4, "d")], runs, "decode0")
    assert store.r.xlen(key("tokens", "t2")) == 1 and store.r.ttl(key("tokens", "t2")) == -1  # (unwatched: written)


def test_only_the_current_run_writes_into_a_stream_or_ends_it(redis_url):
    """A worker that stalled past its lease while the request was re-run, or that another worker
    took over, or whose request ended, gets nothing into the stream and cannot end it: its tokens
    would interleave with the current run's, which continues from a different token. A lease
    that lapsed unnoticed (nobody took the request) still writes."""
    store = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60)
    ids = ("w-mine", "w-rerun", "w-taken", "w-ended", "w-lapsed")
    for rid in ids:
        store.admit(request(rid), [], "", 60)
        assert store.take(rid, 0, "decode0", 30) == Take.CLAIMED
    for rid in ("w-rerun", "w-lapsed"):
        store.r.delete(key("lease", rid))
    assert store.rerun_orphan("w-rerun", 60, 60) == 1
    assert store.take("w-taken", 0, "decode1", 30) == Take.OWNED
    store.r.set(key("lease", "w-taken"), "decode1")  # decode0's lease lapsed; decode1 took it over
    assert store.settle("w-ended", 0, "decode0", "stop")
    tokens = [Token(rid, 0, 7, "a") for rid in ids]
    appended = store.append(tokens, dict.fromkeys(ids, 0), "decode0", ["w-mine"])
    assert appended == ({"w-rerun", "w-taken", "w-ended"}, set())
    assert [store.r.xlen(key("tokens", rid)) for rid in ids] == [1, 0, 0, 1, 1]  # (w-ended: its end alone)
    assert [store.settle(rid, 0, "decode0", "stop", 1) for rid in ids] == [True, False, False, False, True]
    assert [store.done(rid) for rid in ids] == ["stop", None, None, "stop", "stop"]
    assert store.owner("w-taken") == "decode1" and {"w-rerun", "w-taken"} <= set(store.active())
    assert [store.r.xlen(key("tokens", rid)) for rid in ids] == [2, 0, 0, 1, 2]  # the endings: the current runs'
    assert store.append([Token("w-rerun", 0, 7, "a")], {"w-rerun": 1}, "prefill3") == (set(), set())  # the re-run


def test_append_takes_more_requests_and_marks_than_a_lua_unpack_holds(redis_url):
    """A step of 3000 requests watching 9000 cancel marks: 9000 run marks and 9000 cancel marks
    read, past Lua's ~8000 values per unpack (a large ``max_batch``: the step would fail every time)."""
    store = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60)
    ids = [f"big{i}" for i in range(3000)]
    watch = [*ids, *(f"idle{i}" for i in range(6000))]
    store.cancel("idle5999")
    store.r.set(key("attempt", "big2999"), 1)  # re-run since: the last one's run is over
    appended = store.append([Token(rid, 0, 7, "a") for rid in ids], dict.fromkeys(ids, 0), "decode0", watch)
    assert appended == ({"big2999"}, {"idle5999"})
    assert store.r.xlen(key("tokens", "big0")) == 1 and not store.r.exists(key("tokens", "big2999"))


def test_settle_closes_a_stream_exactly_once_and_says_how(redis_url, caplog):
    """A caller whose count of a request's tokens was behind its stream (prefill's retry that had lost
    its streamed first token) settled at an index a token held: the end was skipped as a replay, and
    the request recorded as ended, its stream never closed nor expired, the caller told all was well.
    Now that end goes after the stream's last entry (MOVED); a stream that has ended gets no second
    end (CLOSED_BEFORE; its done mark the finish its readers got, not the cancel asked); one whose
    caller said its last token ended it, wrongly, gets an end without a token (MOVED: it was left
    open, its reader waiting for ever); one that cannot be closed says so (UNCLOSED, logged as an
    error), keeps the end for the gateway, and expires all the same. A handoff's parked state goes
    with the end."""
    store = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60)
    ids = ("e-taken", "e-ended", "e-carried", "e-open", "e-broken")
    for rid in ids:
        store.admit(request(rid), [], "", 60)
        assert store.take(rid, 0, "decode0", 30) == Take.CLAIMED
    done = {"prompt_tokens": 2, "completion_tokens": 1}
    tokens = [Token("e-taken", 0, 7, "a"), Token("e-open", 0, 7, "a")]
    tokens += [Token(rid, 0, 7, "a", "length", done) for rid in ("e-ended", "e-carried")]
    assert store.append(tokens, dict.fromkeys(ids, 0), "decode0") == (set(), set())
    store.r.set(key("tokens", "e-broken"), "not a stream")
    store.r.set(key("kvstate", "e-taken"), b"state")
    settled = [
        store.settle("e-taken", 0, "decode0", "length", 0, usage=done),
        store.settle("e-ended", 0, "decode0", "cancelled", 1),  # (a cancel after the finish landed)
        store.settle("e-carried", 0, "decode0", "length"),
        store.settle("e-open", 0, "decode0", "stop"),
        store.settle("e-broken", 0, "decode0", "error", 0, "failed"),
    ]
    assert settled == [Settled.MOVED, Settled.CLOSED_BEFORE, Settled.CLOSED, Settled.MOVED, Settled.UNCLOSED]
    entries = [decode("e-taken", fields) for _, fields in store.r.xrange(key("tokens", "e-taken"))]
    assert entries == [tokens[0], Token("e-taken", 1, -1, "", "length", done)]
    assert [entry for entry, _ in store.r.xrange(key("tokens", "e-taken"))] == [b"1-0", b"2-0"]
    assert 0 < store.r.ttl(key("tokens", "e-taken")) <= 60 and not store.r.exists(key("kvstate", "e-taken"))
    assert [store.r.xlen(key("tokens", rid)) for rid in ids[1:3]] == [1, 1]  # no second end, nothing to add
    opened = [decode("e-open", fields) for _, fields in store.r.xrange(key("tokens", "e-open"))]
    assert opened == [tokens[1], Token("e-open", 1, -1, "", "stop")]  # its last token had no finish: one added
    assert all(0 < store.r.ttl(key("tokens", rid)) <= 60 for rid in ids)  # unclosed too: no stream kept for ever
    assert [store.done(rid) for rid in ids] == ["length", "length", "length", "stop", "error"]  # the streams' ends
    kept = store.r.hgetall(key("unclosed", "e-broken"))  # (the end it could not take, for the gateway)
    assert decode("e-broken", kept) == Token("e-broken", 0, -1, "", "error", error="failed")
    assert 0 < store.r.ttl(key("unclosed", "e-broken")) <= 60 and not store.r.exists(key("unclosed", "e-taken"))
    assert not {*ids} & set(store.active())
    assert store.settle("e-taken", 0, "decode0", "length", 2) == Settled.STALE  # ended: once
    logged = {(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records if r.name == "dayzero.serving"}
    assert ("WARNING", "request e-taken ended length at 0") in logged
    assert ("WARNING", "request e-open ended stop at None") in logged
    assert ("ERROR", "request e-broken ended error at 0") in logged


def test_a_token_after_a_gap_is_refused_so_a_stream_never_skips_one(redis_url):
    """A run whose append of token i never landed (its round trip timed out in a Redis stall, and
    the worker went on to the next step) must not write token i + 1 after i - 1: the client would
    read a text missing a token, and a re-run, counting the stream's entries, would start at an index
    the stream holds already (the soak: a stream holding 0..67 and 69, its client left waiting).
    The run is refused (its worker drops it; the reaper re-runs the request from the stream's end).
    The late append, landing after, still fits and is written."""
    store = Lifecycle(redis.Redis.from_url(redis_url), stream_ttl_s=60)
    store.admit(request("g-1"), [], "", 60)
    assert store.take("g-1", 0, "decode0", 30) == Take.CLAIMED
    runs = {"g-1": 0}
    assert store.append([Token("g-1", 0, 7, "a")], runs, "decode0") == (set(), set())
    assert store.append([Token("g-1", 2, 9, "c"), Token("g-1", 3, 4, "d")], runs, "decode0") == ({"g-1"}, set())
    assert [entry for entry, _ in store.r.xrange(key("tokens", "g-1"))] == [b"1-0"]
    assert store.append([Token("g-1", 1, 8, "b")], runs, "decode0") == (set(), set())  # the late one
    assert store.append([Token("g-1", 1, 8, "b"), Token("g-1", 2, 9, "c")], runs, "decode0") == (set(), set())
    entries = store.r.xrange(key("tokens", "g-1"))
    assert [decode("g-1", fields).index for _, fields in entries] == [0, 1, 2]
