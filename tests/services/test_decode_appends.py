"""Decode's appends against a real Redis that refuses one of them (``maxmemory`` 1: a script that
writes gets OOM, nothing of it lands) or stops answering: the tokens of the failed append go again,
in order, with the next one, and a request that ended in that step (its finish token, or a cancel
mark the failed call would have read) ends once, at its stream's end. Before, the loop stepped on
with the tokens lost: the next append was refused for the gap, the request dropped, and re-run
(a full prefill) once its lease lapsed, or, if it had ended, its stream never closed."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import httpx
import pytest
import redis

from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.keys import key
from dayzero.serving.outage_log import LOGGED_EVERY_S
from dayzero.serving.records import decode
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import MODEL, run_jobs, sse_events, start_stack, wait_until
from .prefill_jobs import handed_off, needing


@contextlib.contextmanager
def writes_refused(client: redis.Redis, setting: str = "maxmemory"):
    """Redis refuses every write while inside: out of memory with no eviction (``maxmemory``), as a
    loaded one does, or too few replicas (``min-replicas-to-write``), as a primary that lost them."""
    client.config_set(setting, 1)
    try:
        yield
    finally:
        client.config_set(setting, 0)


def _refuse_one_append(runtime: Runtime, when) -> list:
    """Redis refuses the first of the loop's appends whose tokens ``when`` picks. -> the appends' tokens."""
    appends, real_append, refused = [], runtime.store.append, []

    def append(tokens, *args):
        appends.append(tokens)
        if not refused and when(tokens):
            refused.append(tokens)
            with writes_refused(runtime.store.r):
                return real_append(tokens, *args)
        return real_append(tokens, *args)

    runtime.store.append = append
    return appends


def _entries(store, rid: str) -> list[tuple[bytes, dict]]:
    return store.r.xrange(key("tokens", rid))


def test_a_refused_append_with_the_finish_token_is_sent_again_and_the_request_ends_once(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("refused-end",), max_tokens=6)
    runtime = Runtime.load(settings, "decode-refused@test", "decode", False)
    appends = _refuse_one_append(runtime, lambda tokens: any(t.finish_reason for t in tokens))
    run_jobs(DecodeLoop(runtime), sent)
    tokens, finish = store.stream("refused-end")
    assert (len(tokens), finish, store.done("refused-end")) == (6, "length", "length")
    ids = [entry for entry, _ in _entries(store, "refused-end")]
    assert ids == [f"{i}-0".encode() for i in range(1, 7)]  # every token once, the finish last
    assert [t.index for t in appends[-1]] == [5]  # sent again alone: the request stepped no further
    assert runtime.pools.sequences == {}
    runtime.close()


def test_a_request_cancelled_while_its_append_is_refused_ends_at_its_stream_s_end(demo_dir, redis_url):
    """The cancel mark the refused append would have read is read before the next step: the request
    ends cancelled after the tokens on its stream (not after the refused ones: a gap before its end);
    the other request of the batch goes on with its refused token sent again."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("stays-on", "leaves-now"), max_tokens=6)
    runtime = Runtime.load(settings, "decode-cancel@test", "decode", False)

    def third_token(tokens) -> bool:
        if any(t.index == 2 for t in tokens):
            store.cancel("leaves-now")  # the client leaves as the step's append is refused
            return True
        return False

    _refuse_one_append(runtime, third_token)
    run_jobs(DecodeLoop(runtime), sent)
    assert store.done("leaves-now") == "cancelled"
    assert [entry for entry, _ in _entries(store, "leaves-now")] == [b"1-0", b"2-0", b"3-0"]  # the end at index 2
    assert store.done("stays-on") == "length" and len(store.streamed_tokens("stays-on")) == 6
    assert [entry for entry, _ in _entries(store, "stays-on")] == [f"{i}-0".encode() for i in range(1, 7)]
    assert runtime.pools.sequences == {}
    runtime.close()


def test_a_cancel_after_a_finish_whose_append_landed_unanswered_records_the_finish(demo_dir, redis_url):
    """The append of the finish token lands but its answer is lost (a Redis stall past the command
    timeout), and the client's cancel comes before it is sent again: the stream holds the finish
    (what its readers got), and so does the request's done mark (was: "cancelled")."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store, sent = handed_off(settings, ("read-its-end",), max_tokens=4)
    runtime = Runtime.load(settings, "decode-unanswered@test", "decode", False)
    real_append, lost = runtime.store.append, []

    def append(tokens, *args):
        appended = real_append(tokens, *args)
        if not lost and any(t.finish_reason for t in tokens):
            lost.append(tokens)
            store.cancel("read-its-end")  # the client leaves as the finish reaches it
            raise redis.TimeoutError("Timeout reading from socket")
        return appended

    runtime.store.append = append
    run_jobs(DecodeLoop(runtime), sent)
    assert lost and store.stream("read-its-end")[1] == "length"
    assert store.done("read-its-end") == "length"
    runtime.close()


BODY = {"model": MODEL, "prompt": [0, 5, 4, 3, 2], "max_tokens": 200, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def long_lease(text_dir, tmp_path_factory):
    """A stack whose leases outlive the faults (a lapsed lease is re-run whatever decode does)."""
    lease = {"DAYZERO_LEASE_S": "20"}
    stack = start_stack(text_dir, tmp_path_factory.mktemp("logs"), {"prefill": 1, "decode": 1}, lease)
    yield stack
    stack.stop()


def _refused_a_while(stack) -> None:
    with writes_refused(redis.Redis.from_url(stack.redis_url)):
        time.sleep(1.5)


def _stopped_past_the_command_timeout(stack) -> None:
    """SIGSTOP past the workers' 5 s command timeout (an append sent before it lands on SIGCONT: the
    one sent again is a replay, skipped), within the gateway's read bound (keep-alive + 10 s)."""
    stack.redis.send_signal(signal.SIGSTOP)
    try:
        time.sleep(6.5)
    finally:
        stack.redis.send_signal(signal.SIGCONT)


def _loop_failures_said(log) -> int:
    """The decode loop's lines of failed passes: the first of an outage, or a count of those since."""
    text = log.read_text()
    return text.count("redis unavailable") + text.count("passes of the loop failed on Redis")


@pytest.mark.parametrize("fault", [_refused_a_while, _stopped_past_the_command_timeout])
def test_redis_failing_mid_stream_loses_no_token_and_re_runs_nothing(long_lease, fault):
    expected = httpx.post(f"{long_lease.url}/v1/completions", json=BODY, timeout=120).json()["choices"][0]["text"]
    log = long_lease.log_dir / "decode0.log"
    met = _loop_failures_said(log)
    text, faulted = [], threading.Thread(target=fault, args=(long_lease,))
    with httpx.stream("POST", f"{long_lease.url}/v1/completions", json={**BODY, "stream": True}, timeout=120) as r:
        rid = r.headers["x-request-id"]
        for _, data in sse_events(r):
            if data == "[DONE]":
                break
            text.append(data["choices"][0]["text"])
            if len(text) == 20:
                faulted.start()
    faulted.join()
    # the decode loop met the fault: said at once, or counted at the end of the log's throttle window
    # (a fault within LOGGED_EVERY_S of the last outage's line: the one before, under xdist)
    assert wait_until(lambda: _loop_failures_said(log) > met, LOGGED_EVERY_S + 5)
    assert "".join(text) == expected  # every token once
    assert redis.Redis.from_url(long_lease.redis_url).get(key("attempt", rid)) is None  # never re-run


def test_a_request_past_its_time_limit_as_its_append_is_refused_ends_after_the_token_sent_again(demo_dir, redis_url):
    """The time limit passes while a step's append is refused: the request ends "length" once its
    token is out (the refused append skips the loop's beat, where the limit is checked), its usage
    the tokens its stream holds. Its clock starts once decode's runtime is ready (prefill and two
    runtime loads took the 2 s under load: the limit ran out before the third token), its loop built;
    4 s (2 s ran out at load 8-10 before the third token: the request ended waiting, "error")."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", task_time_limit_s=4)
    store, sent = handed_off(settings, ("late",), max_tokens=50)
    runtime = Runtime.load(settings, "decode-late@test", "decode", False)
    loop = DecodeLoop(runtime)
    created = time.time()
    sent = [needing(job, 50, created) for job in sent]

    def third_token(tokens) -> bool:
        if any(t.index == 2 for t in tokens):
            time.sleep(max(0.0, created + 4.1 - time.time()))  # (the limit passes as it is refused)
            return True
        return False

    _refuse_one_append(runtime, third_token)
    run_jobs(loop, sent)
    entries = [decode("late", fields) for _, fields in _entries(store, "late")]
    assert store.done("late") == "length" and entries[-1].finish_reason == "length"
    tokens = [t for t in entries if t.token >= 0]
    assert 3 <= len(tokens) < 50 and entries[-1].usage["completion_tokens"] == len(tokens)  # the limit's end
    runtime.close()
