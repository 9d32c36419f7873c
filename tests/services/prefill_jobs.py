"""Prefill jobs for the prefill loop's tests: a request admitted as the gateway admits it, and a
loop whose pools hold one sequence; decode jobs for the decode loop's tests: requests prefilled and
handed off."""

from __future__ import annotations

import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs


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


def handed_off(settings: Settings, rids: tuple[str, ...], max_tokens: int = 3) -> tuple[Lifecycle, list[DecodeJob]]:
    """Admit a 3-token request per id and run them through a prefill loop: decode's jobs, handed off."""
    store, sent = Lifecycle.connect(settings.redis_url), []
    requests = [
        GenerationRequest(
            request_id=rid, prompt_ids=(0, 5, 6), sampling=SamplingParams(max_tokens=max_tokens), created=time.time()
        )
        for rid in rids
    ]
    for request in requests:
        store.admit(request, [], "", 60)
    prefill = PrefillLoop(Runtime.load(settings, f"prefill-{rids[0]}@test", "prefill", False), recording(sent))
    run_jobs(prefill, [PrefillJob(request=r) for r in requests])
    return store, sent


def needing(job: DecodeJob, max_tokens: int, created: float) -> DecodeJob:
    """``job`` reserving ``max_tokens`` more (decode reserves the whole completion), admitted at ``created``."""
    request = job.request.model_copy(update={"sampling": SamplingParams(max_tokens=max_tokens), "created": created})
    return job.model_copy(update={"request": request})
