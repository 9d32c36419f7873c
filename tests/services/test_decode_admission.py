"""Decode's admission of a handed-off request against a real Redis: taking the handoff reads the
request's cancel mark in the same round trip, so a request cancelled meanwhile ends before a step
and without a read of its own."""

from __future__ import annotations

import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle, key
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs


def test_taking_a_handoff_says_whether_it_was_cancelled(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    assert store.take_handoff("kept", "decode0", 30) is False
    store.cancel("gone")
    assert store.take_handoff("gone", "decode0", 30, holder="prefill0") is True
    assert store.owner("gone") == "decode0" and store.r.lrange(key("taken", "prefill0"), 0, -1) == [b"gone"]


def test_a_request_cancelled_during_its_handoff_ends_before_a_step_without_a_cancel_read(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis")
    store = Lifecycle.connect(redis_url)
    requests = [
        GenerationRequest(
            request_id=rid, prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=3), created=time.time()
        )
        for rid in ("stays", "leaves")
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    sent: list[DecodeJob] = []
    run_jobs(
        PrefillLoop(Runtime.load(settings, "prefill3@test", "prefill", False), recording(sent)),
        [PrefillJob(request=r) for r in requests],
    )
    store.cancel("leaves")  # the client goes while the job waits on decode's queue
    runtime = Runtime.load(settings, "decode3@test", "decode", False)
    loop, stepped, read = DecodeLoop(runtime), [], []
    real_decode, real_cancelled = runtime.ranks.decode, runtime.store.cancelled
    runtime.ranks.decode = lambda ids, tokens: stepped.append(list(ids)) or real_decode(ids, tokens)
    runtime.store.cancelled = lambda rids: read.extend(rids) or real_cancelled(rids)
    run_jobs(loop, sorted(sent, key=lambda job: job.request.request_id))
    assert store.done("leaves") == "cancelled" and len(store.streamed_tokens("leaves")) == 1  # prefill's token
    assert store.done("stays") is not None and all("leaves" not in ids for ids in stepped)
    assert "leaves" not in read  # its mark came with the take
    assert runtime.pools.sequences == {}
