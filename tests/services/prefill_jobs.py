"""Prefill jobs for the prefill loop's tests: a request admitted as the gateway admits it, and a
loop whose pools hold one sequence."""

from __future__ import annotations

import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording


def admitted(store: Lifecycle, rid: str, prompt: tuple[int, ...] = (0, 5, 6, 7, 8)) -> PrefillJob:
    """A request (five tokens unless ``prompt``), admitted as the gateway admits it: its prefill job."""
    request = GenerationRequest(
        request_id=rid, prompt_ids=prompt, sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    store.admit(request, [], "", 60)
    return PrefillJob(request=request)


def one_sequence_loop(demo_dir, redis_url, name: str) -> tuple[PrefillLoop, list[DecodeJob]]:
    """A prefill loop whose pools hold one sequence (handoffs wait for decode up to 600 s), and the
    jobs it sends to decode."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=1, handoff_timeout_s=600)
    sent: list[DecodeJob] = []
    return PrefillLoop(Runtime.load(settings, name, "prefill", False), recording(sent)), sent


def first_append_fails(runtime: Runtime) -> list:
    """Redis goes away after the loop's first forward, before its first token landed. -> the appends."""
    appends, real_append = [], runtime.store.append

    def append_failing_once(tokens, *args):
        appends.append(tokens)
        if len(appends) == 1:
            raise redis.ConnectionError("Redis went away")
        return real_append(tokens, *args)

    runtime.store.append = append_failing_once
    return appends
