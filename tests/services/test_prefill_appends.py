"""Prefill's first token against a real Redis that stops answering as it is appended (SIGSTOP past
the 5 s command timeout): the append raises, yet lands when Redis continues. The request is put back
and prefilled again; its retry must send the same token again (a replay, skipped), not a new sample:
a new sample went to decode while the client had read the first (its text went on after a token the
model never saw). Nor may a peer take it meanwhile (room.py's hand-back): it would sample anew."""

from __future__ import annotations

import signal
import time

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
    """Its append refused (Redis out of memory), the prompt is put back; its retry no longer fits this
    worker's blocks and a live peer's snapshot shows room. It stays here, for its kept token: handed
    back, the peer sampled another after the one the stream may hold (and this worker kept that one)."""
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
        with pytest.raises(redis.ResponseError):
            loop._iteration()
        filled = []  # every block this worker has left, taken by others
        while pools.fits(64):
            filled.append(f"elsewhere{len(filled)}")
            runtime.ranks.reserve(filled[-1], 64)
        assert not pools.fits(len(request.prompt_ids))
        loop._iteration()
        assert handed == [] and [t.job.request.request_id for t in loop.pending] == ["refused"]
        for name in filled:
            runtime.ranks.release(name)
        loop._iteration()
        assert ticket.done.wait(30)
    finally:
        loop.stop.set()
    assert appends[1] == appends[0] and store.streamed_tokens("refused") == appends[0]
    assert [list(job.generated) for job in sent] == [appends[0]]
    runtime.close()
