"""The prefill loop in-process against a real Redis with image requests: embeddings that are gone
fail their request alone, and embeddings taken once serve a batch Redis interrupted when it starts
again."""

from __future__ import annotations

import socket
import time

import torch

from dayzero.params import SamplingParams
from dayzero.serving.handoff import publish_tensor
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob, TensorRef
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import recording, run_jobs
from .prefill_jobs import admitted, first_append_fails


def test_an_image_request_whose_embeddings_are_gone_fails_alone_with_a_clear_error(demo_dir, redis_url):
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill4@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    store = Lifecycle.connect(redis_url)
    request = GenerationRequest(
        request_id="lost-images", prompt_ids=(0, 8, 8, 6), sampling=SamplingParams(max_tokens=4), created=time.time()
    )
    fine = request.model_copy(update={"request_id": "beside-it", "prompt_ids": (0, 5, 6)})
    gone = TensorRef(transport="shm", location="dz-parked-0-gone", host=socket.gethostname(), shape=(2, 64))
    for r in (request, fine):
        store.admit(r, [], "", 60)
    run_jobs(loop, [PrefillJob(request=request, embeddings=gone), PrefillJob(request=fine)], 30)  # one batch
    assert store.done("lost-images") == "error" and "lost-images" not in runtime.pools.sequences
    assert [job.request.request_id for job in sent] == ["beside-it"]  # the rest of its batch goes on
    (_, last), *_ = store.r.xrevrange("dz:tokens:lost-images", count=1)
    assert last[b"e"].startswith(b"its images' embeddings are gone")


def test_an_image_request_redis_interrupts_is_retried_with_the_embeddings_it_took(demo_dir, redis_url):
    """Parked image embeddings are read once (their segment unlinked): a batch retried after Redis
    failed mid-way starts again with those its first start took. It read them again: 'parked tensor
    ... is gone', the request ended with an error (the soak: an image request in a 13 s Redis stop)."""
    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill5@test", "prefill", False)
    sent: list[DecodeJob] = []
    loop = PrefillLoop(runtime, recording(sent))
    appends = first_append_fails(runtime)
    store = Lifecycle.connect(redis_url)
    job = admitted(store, "flaky-image", (0, 8, 8, 6))
    parked = publish_tensor(torch.randn(2, runtime.model.cfg.hidden_size), "flaky-image", "shm", store, 60)
    run_jobs(loop, [job.model_copy(update={"embeddings": parked})], 30)
    assert len(appends) == 2 and [j.request.request_id for j in sent] == ["flaky-image"]
    assert store.done("flaky-image") is None  # handed to decode, not ended
