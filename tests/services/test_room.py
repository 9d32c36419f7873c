"""Handing a claimed handoff back to decode's queue: fenced like every transition, its deadline kept."""

from __future__ import annotations

import redis

from dayzero.params import SamplingParams
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.scripts import Take


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_ids=(0, 5), sampling=SamplingParams(max_tokens=2), created=0.0)


def test_a_claimed_handoff_handed_back_waits_on_the_queue_again_till_its_own_deadline(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    ids = ("b-back", "b-rerun", "b-held", "b-late")
    for rid in ids:
        store.admit(_request(rid), [], "", 60)
        assert store.take(rid, 0, "prefill0", 30) == Take.CLAIMED
        assert store.hand_off(rid, 0, "prefill0", {"b-back": 20, "b-late": 3}.get(rid, 60), "decode", rid)
        assert store.r.rpop("decode") == rid.encode()
        assert store.take(rid, 0, "decode0", 30, handed_off=True) == Take.CLAIMED
    store.r.set(key("attempt", "b-rerun"), 1)  # re-run since (its claim lapsed in a stall)
    store.r.set(key("lease", "b-held"), "decode1")  # someone else's
    pushed = int(store.r.get(key("pushed", "decode")))
    answers = [store.hand_back(rid, 0, "decode0", "decode", f"{rid} again", 10) for rid in ids]
    assert answers == [True, False, False, False]  # b-late: under 10 s of its handoff left
    assert store.r.lrange("decode", 0, -1) == [b"b-back again"]
    assert [store.owner(rid) for rid in ids] == [HANDOFF_OWNER, "decode0", "decode1", "decode0"]  # the rest: untouched
    assert store.r.get(key("handoff", "b-back")) == f"decode:{pushed + 1}".encode()  # a new mark, counted
    lease_ms, handoff_ms = store.r.pttl(key("lease", "b-back")), store.r.pttl(key("handoff", "b-back"))
    assert 10_000 < lease_ms <= 20_000 and abs(lease_ms - handoff_ms) < 1000  # the handoff's own deadline (prefill
    # frees its blocks then), not a new one
    assert store.hand_back("b-back", 0, "decode1", "decode", "not its", 10) is False  # only a claimer hands back
    assert store.rerun_orphan("b-back", 60, 60) == 0  # its message waits: the reaper leaves it
    assert store.r.rpop("decode") == b"b-back again"  # a worker takes it and dies before its claim:
    assert [store.rerun_orphan("b-back", 60, 60) for _ in range(2)] == [0, 1]  # the next sweep re-runs it
    assert store.take("b-back", 0, "decode1", 30, handed_off=True) == Take.STALE  # (a late claim is stale)
