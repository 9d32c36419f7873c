"""The prefill loop in-process against a real Redis: a batch that Redis interrupts is retried."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob, SamplingSpec
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.serving.store import Store
from dayzero.settings import Settings


def test_a_batch_redis_interrupts_is_retried_without_leaking_blocks(demo_dir, redis_url):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill0@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, sent.append)
    appends, real_append = [], runtime.store.append

    def append_failing_once(tokens):
        appends.append(tokens)
        if len(appends) == 1:
            raise redis.ConnectionError("Redis went away")  # after the forward, before the first token landed
        return real_append(tokens)

    runtime.store.append = append_failing_once
    store = Store.connect(redis_url)
    request = GenerationRequest(
        request_id="flaky", prompt_ids=(0, 5, 6, 7, 8), sampling=SamplingSpec(max_tokens=4), created=time.time()
    )
    store.register(request)
    store.mark_queued("flaky", 60)
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        assert loop.intake.submit(PrefillJob(request=request)).done.wait(30)
    finally:
        loop.stop.set()
    assert len(appends) == 2 and len(sent) == 1  # retried once, handed to decode once
    assert store.streamed_tokens("flaky") == [sent[0].generated[0]]
    assert set(runtime.pools.sequences) == {"flaky"}  # only the handed-off state: nothing from the failed try
    held = runtime.pools.sequences["flaky"].tables
    assert all(len(held[k]) == runtime.pools.layout.blocks_for(k, 5) for k in held)


def test_a_failed_forward_ends_its_requests_and_frees_their_blocks(demo_dir, redis_url, monkeypatch):
    import dayzero.serving.prefill_loop as prefill_loop

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill1@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, sent.append)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(prefill_loop, "prefill", broken)
    store = Store.connect(redis_url)
    request = GenerationRequest(
        request_id="broken", prompt_ids=(0, 5, 6), sampling=SamplingSpec(max_tokens=4), created=time.time()
    )
    store.register(request)
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        assert loop.intake.submit(PrefillJob(request=request)).done.wait(30)
    finally:
        loop.stop.set()
    assert store.done("broken") == "error" and not sent
    assert runtime.pools.sequences == {}  # its blocks are free again
    (_, last), *_ = store.r.xrevrange("dz:tokens:broken", count=1)
    assert last[b"e"] == b"prefill failed: RuntimeError"
