"""The prefill loop in-process against a real Redis with image requests: embeddings that are gone
fail their request alone, and embeddings taken once serve a batch Redis interrupted when it starts
again."""

from __future__ import annotations

import logging
import socket
import time

import torch

from dayzero.params import SamplingParams
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import DecodeJob, GenerationRequest, PrefillJob, TensorRef
from dayzero.serving.parked import publish_tensor
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


def test_a_stale_run_whose_embeddings_its_re_run_unlinked_is_dropped_not_failed(
    demo_dir, redis_url, monkeypatch, caplog
):
    """The worker's step ran past the lease, the reaper re-ran the request at the vision stage, and
    vision unlinked the old run's embeddings; the stalled worker then starts the old run: 'parked
    tensor ... is gone' was logged as an ERROR and counted a prefill failure (the soak's). The run is
    stale: dropped with the stale-run warning, the request left to its re-run."""
    import dayzero.serving.prefill_loop as prefill_loop

    runtime = Runtime.load(Settings(checkpoint=demo_dir, redis_url=redis_url), "prefill6@test", "prefill", False)
    loop, store, real_input = (
        PrefillLoop(runtime, recording([])),
        Lifecycle.connect(redis_url),
        prefill_loop.batch_input,
    )
    gone = TensorRef(transport="shm", location="dz-parked-0-stale", host=socket.gethostname(), shape=(2, 64))
    job = admitted(store, "stale-image", (0, 8, 8, 6)).model_copy(update={"embeddings": gone})

    def re_run_first(ticket, r_store):
        store.r.delete(key("lease", "stale-image"))  # it lapsed while a long step ran
        assert store.rerun_orphan("stale-image", 60, 60) == 1  # the reaper re-runs it (attempt 1)
        return real_input(ticket, r_store)

    monkeypatch.setattr(prefill_loop, "batch_input", re_run_first)
    with caplog.at_level(logging.WARNING, logger="dayzero.prefill"):
        run_jobs(loop, [job], 30)
    assert [r.levelname for r in caplog.records if "stale-image" in r.getMessage()] == ["WARNING"]
    assert "dropping this run" in caplog.text and "is gone" not in caplog.text
    assert runtime.stats.snapshot()["failures"].get("prefill", 0) == 0  # (was: 1)
    assert store.done("stale-image") is None and store.r.exists(key("queued", "stale-image"))  # the re-run's
    assert "stale-image" not in runtime.pools.sequences
