"""Prefill's first token against a real Redis that stops answering as it is appended (SIGSTOP past
the 5 s command timeout): the append raises, yet lands when Redis continues. The request is put back
and prefilled again; its retry must send the same token again (a replay, skipped), not a new sample:
a new sample went to decode while the client had read the first (its text went on after a token the
model never saw). Nor may a peer take it meanwhile (room.py's hand-back): it would sample anew."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
import redis

from dayzero.params import SamplingParams
from dayzero.procs import free_port, start_redis
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted
from .test_decode_appends import writes_refused


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of the test's own, to stop: (its process, its url)."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log")
    try:
        yield server, f"redis://127.0.0.1:{port}/0"
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()


def test_a_first_token_whose_append_timed_out_but_landed_is_the_one_handed_to_decode(demo_dir, own_redis):
    server, url = own_redis
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=url), "prefill-stopped@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop, appends, real_append = PrefillLoop(runtime, recording(sent)), [], runtime.store.append

    def append_as_redis_stops(tokens, *args):
        appends.append([t.token for t in tokens])
        if len(appends) > 1:
            return real_append(tokens, *args)
        runtime.store.r.ping()  # (the connection the append reuses sends no health check first, unanswered)
        server.send_signal(signal.SIGSTOP)
        try:  # stopped past the command timeout: the append raises...
            return real_append(tokens, *args)
        finally:  # ... and lands as Redis continues, before the retry's
            server.send_signal(signal.SIGCONT)

    runtime.store.append = append_as_redis_stops
    runtime.store.load_scripts()  # (as a worker does on starting: else the append lands as an unknown script's)
    store = Lifecycle.connect(url)
    sampling = SamplingParams(max_tokens=4, temperature=2.0)  # unseeded: a new sample is another token
    request = GenerationRequest(request_id="stopped", prompt_ids=(0, 5, 6, 7), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    run_jobs(loop, [PrefillJob(request=request)], 60)
    assert len(appends) == 2  # put back once, prefilled again
    assert store.streamed_tokens("stopped") == appends[0]  # the first try's token landed after all
    assert [list(job.generated) for job in sent] == [appends[0]]  # decode goes on after the token streamed
    assert appends[1] == appends[0]  # sent again, not sampled anew
    runtime.close()


def test_a_prompt_whose_first_token_may_have_landed_is_not_handed_to_a_peer(demo_dir, redis_url):
    """Its append refused (Redis out of memory), the prompt is put back; the rest of this worker's
    blocks fill and a live peer's snapshot shows room. It stays here, for its kept token: handed back,
    the peer sampled another after the one the stream may hold (and this worker kept that one). Its
    prefilled state is kept too: the retry needs no more blocks, and goes to decode from here."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, handed, sent = Runtime.load(settings, "prefill-refused@test", "prefill", False), [], []
    loop = PrefillLoop(runtime, recording(sent), Room(runtime, Prefetch(), to_prefill(runtime, recording(handed))))
    pools, store, appends = runtime.pools, Lifecycle.connect(redis_url), []
    empty = {kind: [0, total] for kind, (_, total) in pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill-peer@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    real_append = runtime.store.append

    def refused_once(tokens, *args):
        appends.append([t.token for t in tokens])
        if len(appends) == 1:
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        return real_append(tokens, *args)

    runtime.store.append = refused_once
    sampling = SamplingParams(max_tokens=4, temperature=2.0)
    request = GenerationRequest(request_id="refused", prompt_ids=(0, 5, 6, 7), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    ticket = loop.intake.submit(PrefillJob(request=request))
    try:
        loop._iteration()  # its first append refused: it waits for the retry, kept
        filled = []  # every block this worker has left, taken by others
        while pools.fits(64):
            filled.append(f"elsewhere{len(filled)}")
            runtime.ranks.reserve(filled[-1], 64)
        assert not pools.fits(len(request.prompt_ids))
        _iterate(loop, ticket.done.is_set)
        assert handed == [] and loop.pending == []
        for name in filled:
            runtime.ranks.release(name)
    finally:
        loop.stop.set()
    assert appends[1] == appends[0] and store.streamed_tokens("refused") == appends[0]
    assert [list(job.generated) for job in sent] == [appends[0]]
    runtime.close()


def _iterate(loop: PrefillLoop, until: Callable[[], bool], iterations: int = 400) -> None:
    """Run the loop's iterations until ``until()`` (none raises: Redis refusing writes fails the
    sends, which wait for their retry, and the worker's metrics, which wait for its next beat)."""
    for _ in range(iterations):
        if until():
            return
        loop._iteration()
    assert until()


def _counted_loop(settings: Settings, name: str) -> tuple[PrefillLoop, list[DecodeJob], list[int]]:
    """A prefill loop, the jobs it sends to decode, and the tokens of each prefill forward it runs."""
    runtime, sent, tokens = Runtime.load(settings, name, "prefill", False), [], []
    real_prefill = runtime.ranks.prefill
    runtime.ranks.prefill = lambda chunks: tokens.append(sum(len(c.tokens) for c in chunks)) or real_prefill(chunks)
    return PrefillLoop(runtime, recording(sent)), sent, tokens


def test_a_prompt_whose_first_append_redis_refused_is_sent_again_not_prefilled_again(demo_dir, redis_url):
    """Redis refuses writes (out of memory) from the first token's append on, for two of the loop's
    tries. The prompt's state stays in its blocks while it waits: the retries send the same token again,
    and then the handoff, from the one prefill (each retry was a whole prefill again: a 3,001-token
    prompt's first token came 2.4-2.8 s late after a 2 s refusal, against 0.5-0.7 s)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff_timeout_s=600)
    loop, sent, prefills = _counted_loop(settings, "prefill-kept@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    sampling = SamplingParams(max_tokens=4, temperature=2.0)  # unseeded: a new sample is another token
    request = GenerationRequest(request_id="kept", prompt_ids=(0, 5, 6, 7), sampling=sampling, created=time.time())
    store.admit(request, [], "", 60)
    appends, real_append = [], runtime.store.append
    runtime.store.append = lambda tokens, *args: appends.append([t.token for t in tokens]) or real_append(tokens, *args)
    ticket = loop.intake.submit(PrefillJob(request=request))
    try:
        with writes_refused(store.r):
            _iterate(loop, lambda: len(appends) == 2)
            assert "kept" in runtime.pools.sequences and not ticket.done.is_set()  # its state, waiting
        _iterate(loop, ticket.done.is_set)
    finally:
        loop.stop.set()
    assert prefills == [4]  # prefilled once
    assert len(appends) == 3 and appends[0] == appends[1] == appends[2] == store.streamed_tokens("kept")
    assert [list(job.generated) for job in sent] == appends[:1] and "kept" in runtime.pools.sequences  # for decode
    runtime.close()


def test_a_kept_prefill_s_blocks_go_once_its_request_is_cancelled(demo_dir, redis_url):
    """Its first append refused, a prefilled prompt waits with its blocks; its client leaves. The
    cancel is read while Redis still refuses writes (its end cannot be written yet: it stays, and is
    tried again), then written: the blocks go, with no prefill again and nothing sent to decode."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff_timeout_s=600)
    loop, sent, prefills = _counted_loop(settings, "prefill-left@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    ticket = loop.intake.submit(admitted(store, "left"))
    try:
        with writes_refused(store.r):
            _iterate(loop, lambda: bool(loop.kept))  # prefilled, its first append refused
        store.cancel("left")
        with writes_refused(store.r):
            with pytest.raises(redis.ResponseError, match="OOM"):
                loop._iteration()  # the cancel read, its end refused
            assert "left" in runtime.pools.sequences and [t.job.request.request_id for t in loop.pending] == ["left"]
        _iterate(loop, ticket.done.is_set)
    finally:
        loop.stop.set()
    assert store.done("left") == "cancelled" and store.streamed_tokens("left") == []
    assert runtime.pools.sequences == {} and loop.pending == [] and not loop.kept and prefills == [5] and sent == []
    runtime.close()


def test_prompts_under_way_advance_while_a_refused_first_token_waits_to_be_sent_again(demo_dir, redis_url):
    """Redis refuses one prompt's first append (its tokens alone: the others' land) while a long prompt
    is under way beside it, a chunk a step. The refused one waits for its retry, kept; the loop goes on
    prefilling the long one and sends its first token and handoff (it paused as a whole, every try
    raising: no prompt advanced while one waited). Once Redis takes it, the refused one goes, from its
    one prefill."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, prefill_chunk_size=4, handoff_timeout_s=600)
    loop, sent, prefills = _counted_loop(settings, "prefill-beside@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    refusing, appends, real_append = [True], [], runtime.store.append

    def refusing_one(tokens, *args):
        appends.append([(t.request_id, t.token) for t in tokens])
        if refusing[0] and any(t.request_id == "refused-beside" for t in tokens):
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        return real_append(tokens, *args)

    runtime.store.append = refusing_one
    long = loop.intake.submit(admitted(store, "long-beside", (0, *range(5, 45))))  # 41 tokens: 11 chunks
    try:
        loop._iteration()  # its first chunk
        refused = loop.intake.submit(admitted(store, "refused-beside"))
        for _ in range(100):  # (no iteration raises: Redis failed a send, not the loop)
            loop._iteration()
            if long.done.is_set():
                break
        assert long.done.is_set() and [job.request.request_id for job in sent] == ["long-beside"]
        assert not refused.done.is_set() and loop.kept.holds(refused) and "refused-beside" in runtime.pools.sequences
        refusing[0] = False
        for _ in range(100):
            loop._iteration()
            if refused.done.is_set():
                break
    finally:
        loop.stop.set()
    assert refused.done.is_set() and [job.request.request_id for job in sent] == ["long-beside", "refused-beside"]
    tries = [tokens for tokens in appends if tokens[0][0] == "refused-beside"]
    assert len(tries) >= 2 and all(tokens == tries[0] for tokens in tries)  # the same token, sent again
    assert (
        store.streamed_tokens("refused-beside") == [tries[0][0][1]] and sum(prefills) == 41 + 5
    )  # each prefilled once
    runtime.close()


def test_a_prompt_under_way_advances_while_redis_refuses_every_write(demo_dir, redis_url):
    """Redis at its memory limit refuses every write: the worker's own metrics too, published with
    its liveness a few times a lease. That write raised out of the loop's iteration, which paused
    the whole loop (0.5 s each quarter lease) while the prompts under way needed no write. Now a
    long prompt advances a chunk every iteration, none raising; its first token waits, kept, and
    goes once Redis takes writes again."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, prefill_chunk_size=4, handoff_timeout_s=600)
    loop, sent, prefills = _counted_loop(settings, "prefill-refusing@test")
    runtime, store = loop.r, Lifecycle.connect(redis_url)
    long = loop.intake.submit(admitted(store, "long-refused", (0, *range(5, 45))))  # 41 tokens: 11 chunks
    try:
        with writes_refused(store.r):
            for _ in range(11):  # (no iteration raises: the metrics wait for the next beat)
                loop._iteration()
            assert prefills == [4] * 10 + [1] and loop.kept.holds(long) and not long.done.is_set()
        _iterate(loop, long.done.is_set)
    finally:
        loop.stop.set()
    assert [job.request.request_id for job in sent] == ["long-refused"] and sum(prefills) == 41
    runtime.close()
