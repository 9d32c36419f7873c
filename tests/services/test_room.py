"""Room across decode workers: a request one worker's pools cannot hold yet goes back to the queue for
a worker with room (its handoff fenced like every transition), where it waited for one of its
worker's own requests to end while another worker idled."""

from __future__ import annotations

import signal
import threading

import httpx
import redis

from dayzero.params import SamplingParams
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.messages import GenerationRequest
from dayzero.serving.registry import Registry
from dayzero.serving.scripts import Take

from .conftest import MODEL, pool_usage, sse_events, start_stack, wait_until

# 1 MB of KV with 32 sequences' windows: 55 CSA blocks of 64 tokens per worker. A request of 1250
# tokens takes 20: a worker holds two of them, never three (hand-computed; the HCA pool agrees).
ROOM_ENV = {
    "DAYZERO_MAX_BATCH": "32",
    "DAYZERO_KV_BUDGET_MB": "1",
    "DAYZERO_MAX_CONTEXT": "3000",
    "DAYZERO_MAX_TOKENS_LIMIT": "3000",
}
LONG = 1245  # completion tokens (the prompt is a few): 1250 in all
PER_WORKER = 2


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


def _stream(url: str, events: list, lock: threading.Lock, texts: dict, i: int, done: threading.Event) -> None:
    """One long streamed completion: ("decoding", i) once its third chunk came (prefill sends the first
    token at most, decode the rest), ("ended", i) at its finish; its text in ``texts``. Closes when
    ``done`` is set (the request is cancelled)."""
    body = {"model": MODEL, "prompt": "one prompt", "max_tokens": LONG, "ignore_eos": True, "temperature": 0}
    chunks = []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        for _, data in sse_events(r):
            if data == "[DONE]" or done.is_set():
                break
            chunks.append(data["choices"][0]["text"])
            texts[i] = "".join(chunks)
            with lock:
                if len(chunks) == 3:
                    events.append(("decoding", i))
                if data["choices"][0]["finish_reason"]:
                    events.append(("ended", i))


def test_requests_one_decode_worker_cannot_hold_go_to_the_one_with_room(text_dir, tmp_path):
    """decode1 frozen while four long requests are prefilled: decode0 takes what it can hold and more
    (Celery's prefetch). decode1 continued, every request decodes before any ends: decode0 handed it
    what it could not hold. The handed-back requests' text is the others' (same prompt, greedy)."""
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 2}, ROOM_ENV)
    decode1, r = stack.child("decode1").proc, redis.Redis.from_url(stack.redis_url)
    events, lock, texts, done, threads = [], threading.Lock(), {}, threading.Event(), []
    try:
        decode1.send_signal(signal.SIGSTOP)
        for i in range(2 * PER_WORKER):
            threads.append(threading.Thread(target=_stream, args=(stack.url, events, lock, texts, i, done)))
            threads[-1].start()
        live = lambda: Registry(r).live_workers("decode", 1.0)  # noqa: E731 - beats within a lease
        assert wait_until(lambda: len(events) >= PER_WORKER and not r.llen("prefill") and len(live()) == 1, 60)
        decode1.send_signal(signal.SIGCONT)  # decode0 holds the rest (waiting, or handed back)
        wait_until(lambda: len(events) == 2 * PER_WORKER or any(kind == "ended" for kind, _ in events), 120)
        with lock:
            seen = list(events)
        assert seen and all(kind == "decoding" for kind, _ in seen), seen  # every one decodes before any ends
        assert len(seen) == 2 * PER_WORKER, seen

        def served() -> dict[str, float]:
            snaps = pool_usage(stack).items()
            return {name: snap["counters"].get("tokens", 0) for name, snap in snaps if snap["stage"] == "decode"}

        assert wait_until(lambda: len(served()) == 2 and all(served().values()), 10), served()  # both generate
        wait_until(lambda: min(len(t) for t in texts.values()) >= 40, 60)
        shortest = min(len(t) for t in texts.values())
        assert shortest >= 40 and len({t[:shortest] for t in texts.values()}) == 1  # the handed-back states intact
    finally:
        done.set()
        decode1.send_signal(signal.SIGCONT)
        for thread in threads:
            thread.join(60)
        stack.stop()
