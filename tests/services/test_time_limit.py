"""DAYZERO_TASK_TIME_LIMIT_S bounds a request's time from admission: decode ends one that runs past
it with an error naming the limit, and lets the others run (a real Redis, prefill and decode loops)."""

from __future__ import annotations

import time

from dayzero.params import SamplingParams
from dayzero.serving.decode_loop import DecodeLoop
from dayzero.serving.lifecycle import Lifecycle, key
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.records import decode
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs


def test_a_request_past_the_time_limit_ends_with_an_error_and_the_others_go_on(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, handoff="redis", task_time_limit_s=2)
    store, sent = Lifecycle.connect(settings.redis_url), []
    long = SamplingParams(max_tokens=2000, ignore_eos=True)
    requests = [
        GenerationRequest(request_id="overdue", prompt_ids=(0, 5, 6), sampling=long, created=time.time()),
        GenerationRequest(
            request_id="short", prompt_ids=(0, 5, 7), sampling=SamplingParams(max_tokens=3), created=time.time()
        ),
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    prefill = PrefillLoop(Runtime.load(settings, "prefill-limit@test", "prefill", False), recording(sent))
    run_jobs(prefill, [PrefillJob(request=r) for r in requests])
    runtime = Runtime.load(settings, "decode-limit@test", "decode", False)
    started = time.time()
    run_jobs(DecodeLoop(runtime), sent, timeout_s=60)
    assert store.done("short") == "length" and store.done("overdue") == "error"
    last = decode("overdue", store.r.xrevrange(key("tokens", "overdue"), count=1)[0][1])
    assert last.error == "the request ran past DAYZERO_TASK_TIME_LIMIT_S (2 s)"
    assert 1 < last.index < 2000 and time.time() - started < 30
    runtime.close()
