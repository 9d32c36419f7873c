"""The vision stage's lease, the reaper's routing of image requests, and the fate of parked
embeddings whose request ends before prefill reads them (real Redis, in-process stages)."""

from __future__ import annotations

import threading
import time

import redis

from dayzero.params import SamplingParams
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.parked import discard_tensor, take_tensor
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.reaper import sweep
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.serving.vision_stage import VisionStage
from dayzero.settings import Settings
from dayzero.shm import SHM_DIR

from ..vision.conftest import encoded
from .conftest import recording, run_jobs, wait_until


def _request(rid: str, images: int) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, prompt_ids=(0, 2, 5), sampling=SamplingParams(max_tokens=2), created=time.time(), images=images
    )


def test_stage_encodes_then_hands_the_request_to_prefill(demo_dir, redis_url, caplog):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision0@test", recording(sent, "prefill"))
    try:
        store = Lifecycle.connect(redis_url)
        request = _request("img-1", 1)
        store.admit(request, [encoded(28, 28, seed=1)], "", 60)
        stage.handle(PrefillJob(request=request))
        assert len(sent) == 1 and sent[0].embeddings is not None
        # prefill may claim it; the reaper waits
        assert store.owner("img-1") is None and store.r.exists(key("queued", "img-1"))
        # a 28x28 image is resized up to min_pixels (56x56): 2x2 merged patches of the LM width
        assert tuple(take_tensor(sent[0].embeddings, store).shape) == (4, 64)

        store.admit(_request("img-2", 1), [encoded(28, 28, seed=2)], "", 60)
        store.take("img-2", 0, "vision1@elsewhere", 30)  # a live worker owns it
        stage.handle(PrefillJob(request=_request("img-2", 1)))
        assert len(sent) == 1

        # bytes no decoder reads (the gateway checks them; a worker must still end the request): an
        # error, in the log under the request's id
        store.admit(_request("img-3", 1), [b"\x89PNG not really"], "", 60)
        stage.handle(PrefillJob(request=_request("img-3", 1)))
        assert len(sent) == 1 and store.done("img-3") == "error"
        assert "request img-3: image refused" in caplog.text
    finally:
        stage.close()  # its heartbeat thread ends


def test_an_encode_hung_past_the_group_timeout_lets_its_lease_lapse(demo_dir, redis_url):
    """An encode that never returns held the request's lease for ever (the reaper never re-ran it)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.4, group_timeout_s=1.0)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision2@test", recording(sent, "prefill"))
    store, lapsed = Lifecycle.connect(redis_url), []
    fast = stage.encoder.embeddings

    def hung(images):
        lapsed.append(wait_until(lambda: store.owner("img-hung") is None, 10.0))
        return fast(images)

    stage.encoder.embeddings = hung
    try:
        store.admit(_request("img-hung", 1), [encoded(28, 28, seed=3)], "", 60)
        stage.handle(PrefillJob(request=_request("img-hung", 1)))
        assert lapsed == [True]
    finally:
        stage.close()
        for job in sent:  # (a returning encode hands on: its embeddings were parked)
            discard_tensor(job.embeddings, store)


def test_an_encode_under_way_at_the_stop_keeps_its_lease(demo_dir, redis_url):
    """SIGTERM (``StageWorker._hand_back``: the stage's stop, its hand back) while an encode runs: the
    warm shutdown waits for it, so its lease is beaten on. The stop ended the heartbeat's thread: the
    lease of an encode longer than a lease lapsed under it, and a sweep ran it a second time."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, lease_s=0.4)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision5@test", recording(sent, "prefill"))
    store, lapsed = Lifecycle.connect(redis_url), []
    fast = stage.encoder.embeddings

    def stopped_meanwhile(images):
        stage.stop.set()
        stage.hand_back(0)
        lapsed.append(wait_until(lambda: store.owner("img-stop") is None, 4 * settings.lease_s))
        return fast(images)

    stage.encoder.embeddings = stopped_meanwhile
    try:
        store.admit(_request("img-stop", 1), [encoded(28, 28, seed=4)], "", 60)
        stage.handle(PrefillJob(request=_request("img-stop", 1)))
        assert lapsed == [False] and [job.request.request_id for job in sent] == ["img-stop"]
    finally:
        stage.close()
        for job in sent:
            discard_tensor(job.embeddings, store)


def test_a_claim_redis_refuses_is_given_up_at_the_stop(demo_dir, redis_url):
    """SIGTERM while Redis refuses a delivery's take (restarting, or at its memory limit): the claim is
    given up (its message left to the reaper) and the task ends, as prefill's and decode's do. With the
    leases' beats kept to ``close`` the claim was retried till then: the warm shutdown waited for the
    task, and ``close`` comes after it (or with the grace's watchdog)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    stage, tries = VisionStage(settings, "vision6@test", recording([], "prefill")), []

    def refused(*_):
        tries.append(1)
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")

    stage.store.take = refused
    handled = threading.Thread(target=stage.handle, args=(PrefillJob(request=_request("img-refused", 1)),))
    try:
        stage.stop.set()
        stage.hand_back(0)
        handled.start()
        handled.join(30)
        assert tries and not handled.is_alive()
    finally:
        stage.close()
        handled.join(30)


def test_an_encode_whose_run_moved_on_hands_nothing_on(demo_dir, redis_url):
    """The worker stalled past its lease while it encoded (SIGSTOPped), the request was re-run and
    a prefill worker holds it now: the late hand-on deleted that worker's lease (its heartbeat then
    dropped the request, which the reaper re-ran once more) and parked embeddings nobody reads."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision3@test", recording(sent, "prefill"))
    store = Lifecycle.connect(redis_url)
    fast = stage.encoder.embeddings

    def overtaken(images):
        store.r.delete(key("lease", "img-late"))  # lapsed while the worker stood still
        assert store.rerun_orphan("img-late", 60, 60) == 1
        assert store.take("img-late", 1, "prefill1@elsewhere", 30) == Take.CLAIMED  # the re-run's
        return fast(images)

    stage.encoder.embeddings = overtaken
    queued = store.r.llen("prefill")
    try:
        stage.handle(_register(redis_url, "img-late"))
    finally:
        stage.close()
    assert store.owner("img-late") == "prefill1@elsewhere" and store.r.llen("prefill") == queued
    assert not (SHM_DIR / sent[0].embeddings.location).exists()


def test_a_rerun_unlinks_the_embeddings_its_lost_run_parked(demo_dir, redis_url):
    """A prefill worker killed, or frozen and restarted, with the message it had taken: the reaper
    re-ran the request through vision, and the embeddings the lost message pointed to stayed in
    /dev/shm until their deadline (the broker's visibility timeout, 70 minutes)."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision4@test", recording(sent, "prefill"))
    store = Lifecycle.connect(redis_url)
    try:
        job = _register(redis_url, "img-lost")
        stage.handle(job)
        store.r.delete(key("queued", "img-lost"))  # its message left with the prefill worker that took it
        assert store.rerun_orphan("img-lost", 60, 60) == 1
        stage.handle(job.model_copy(update={"attempt": 1}))
    finally:
        stage.close()
    lost, rerun = (SHM_DIR / job.embeddings.location for job in sent)
    assert not lost.exists() and rerun.exists()
    discard_tensor(sent[1].embeddings, store)


def test_reaper_sends_lost_image_requests_back_to_vision(redis_url):
    store = Lifecycle.connect(redis_url)
    store.admit(_request("lost-img", 1), [b"x"], "", 0.001)  # queued; no stage claimed them in time
    store.admit(_request("lost-text", 0), [], "", 0.001)
    time.sleep(0.05)
    routed: dict[str, str] = {}
    store.r.delete("dz:reaper")
    sweep(store, lambda job, stage: routed.setdefault(job.request.request_id, stage), 60, 100, 60)
    assert routed["lost-img"] == "vision" and routed["lost-text"] == "prefill"


def test_prefill_frees_the_embeddings_of_a_request_cancelled_in_its_queue(demo_dir, redis_url):
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url)
    sent: list[PrefillJob] = []
    stage = VisionStage(settings, "vision0@test", recording(sent, "prefill"))
    try:
        stage.handle(_register(redis_url, "cancelled-img"))
    finally:
        stage.close()  # its heartbeat thread ends
    parked = sent[0].embeddings
    assert (SHM_DIR / parked.location).exists()
    store = Lifecycle.connect(redis_url)
    store.cancel("cancelled-img")  # the client left while the request waited for prefill

    loop = PrefillLoop(Runtime.load(settings, "prefill0@test", "prefill", shared=False), recording(sent))
    run_jobs(loop, [sent[0]], 30)
    assert store.done("cancelled-img") == "cancelled" and len(sent) == 1
    assert not (SHM_DIR / parked.location).exists()


def _register(redis_url: str, rid: str) -> PrefillJob:
    store = Lifecycle.connect(redis_url)
    request = _request(rid, 1)
    store.admit(request, [encoded(28, 28, seed=3)], "", 60)
    return PrefillJob(request=request)
