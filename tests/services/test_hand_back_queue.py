"""Where a handed-back request waits: at its stage's queue's front, the next read's, with a counted
mark that the reaper reads right (its own, and every message's behind it). Pushed to the back, a
handed-back request (admitted before everything queued after it) waited behind all of them: with
64 newer prompts queued, 64 were read before it (bench/handback_order.py)."""

from __future__ import annotations

import json

import redis

from dayzero.params import SamplingParams
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.prefilling import tokens_of
from dayzero.serving.queue import make_celery
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.serving.scripts import Take
from dayzero.settings import Settings

from .conftest import recording
from .prefill_jobs import admitted


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0.0)


def _left(store: Lifecycle, rid: str) -> bool:
    """Whether the reaper reads the request's mark as its message gone from the queue (a first
    sighting, only noted: cleared again here)."""
    assert store.rerun_orphan(rid, 60, 60) == 0
    return bool(store.r.delete(key("orphan", rid)))


def test_a_claimed_handoff_handed_back_waits_at_the_queue_front_till_its_own_deadline(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.delete("decode")
    ids = ("b-back", "b-rerun", "b-held", "b-late", "b-newer")
    for rid in ids:
        store.admit(_request(rid), [], "", 60)
        assert store.take(rid, 0, "prefill0", 30) == Take.CLAIMED
        assert store.hand_off(rid, 0, "prefill0", {"b-back": 20, "b-late": 3}.get(rid, 60), "decode", rid)
        if rid != "b-newer":  # (it waits on the queue, admitted after the rest)
            assert store.r.rpop("decode") == rid.encode()
            assert store.take(rid, 0, "decode0", 30, handed_off=True) == Take.CLAIMED
    store.r.set(key("attempt", "b-rerun"), 1)  # re-run since (its claim lapsed in a stall)
    store.r.set(key("lease", "b-held"), "decode1")  # someone else's
    pushed = int(store.r.get(key("pushed", "decode")))
    answers = [store.hand_back(rid, 0, "decode0", "decode", f"{rid} again", 10) for rid in ids[:4]]
    assert answers == [True, False, False, False]  # b-late: under 10 s of its handoff left
    assert store.r.lrange("decode", 0, -1) == [b"b-newer", b"b-back again"]  # the next read's, not behind b-newer
    assert [store.owner(rid) for rid in ids[:4]] == [
        HANDOFF_OWNER,
        "decode0",
        "decode1",
        "decode0",
    ]  # the rest: untouched
    assert store.r.get(key("handoff", "b-back")) == f"decode:{pushed - 1}".encode()  # a new mark, counted
    assert int(store.r.get(key("pushed", "decode"))) == pushed
    lease_ms, handoff_ms = store.r.pttl(key("lease", "b-back")), store.r.pttl(key("handoff", "b-back"))
    assert 10_000 < lease_ms <= 20_000 and abs(lease_ms - handoff_ms) < 1000  # the handoff's own deadline (prefill
    # frees its blocks then), not a new one
    assert store.hand_back("b-back", 0, "decode1", "decode", "not its", 10) is False  # only a claimer hands back
    assert not _left(store, "b-back") and not _left(store, "b-newer")  # both messages wait: the reaper leaves them
    assert store.r.rpop("decode") == b"b-back again"  # a worker takes it and dies before its claim:
    assert _left(store, "b-back") and not _left(store, "b-newer")  # (b-newer's mark still right, one read later)
    assert [store.rerun_orphan("b-back", 60, 60) for _ in range(2)] == [0, 1]  # the next sweep re-runs it
    assert store.take("b-back", 0, "decode1", 30, handed_off=True) == Take.STALE  # (a late claim is stale)
    assert store.r.rpop("decode") == b"b-newer" and _left(store, "b-newer")


def test_a_prompt_handed_back_is_the_next_read_of_prefills_queue_before_newer_prompts(demo_dir, redis_url):
    """A prefill worker whose pools are full claimed "old"; three newer prompts were admitted behind it
    (their messages on prefill's queue); a live peer shows room, so "old" goes back. A consumer's
    next read of prefill's queue (kombu's, over its priority lists) gets "old", then the newer ones
    in their order; every mark reads as waiting till its message is read. Fenced: once a peer claimed
    it, the worker's push of it writes nothing."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, store = Runtime.load(settings, "prefill30@test", "prefill", False), Lifecycle.connect(redis_url)
    push = to_prefill(runtime, recording([], "prefill"))
    room = Room(runtime, Prefetch(), push)
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())
    empty = {kind: [0, total] for kind, (_, total) in runtime.pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill31@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    store.r.delete("prefill")  # (what earlier tests left there)
    old = admitted(store, "q-old", tuple(range(2, 302)))
    loop.intake.submit(old)  # claimed (its message, as a worker's read took it, is not queued here)
    newer = [f"q-new{i}" for i in range(3)]
    for rid in newer:
        store.enqueue(rid, "prefill", recording([], "prefill")(admitted(store, rid)), 60)
    try:
        assert room.hand_back(loop.intake.drain(0), tokens_of, loop.heartbeat) == []
    finally:
        loop.stop.set()
    assert store.owner("q-old") is None and store.r.llen("prefill") == 4
    with make_celery(settings).connection_for_read() as connection:
        channel, order = connection.default_channel, []
        while message := channel.basic_get("prefill", no_ack=True):
            (payload, *_), _, _ = message.decode()
            order.append(json.loads(payload)["request"]["request_id"])
            assert _left(store, order[-1]) and not any(_left(store, rid) for rid in {"q-old", *newer} - {*order})
    assert order == ["q-old", *newer]
    assert store.take("q-old", 0, "prefill31@test:peer", 30) == Take.CLAIMED  # the peer's now:
    assert push(old, "q-old") is False and not store.r.llen("prefill")  # only the run's claimer hands it on
