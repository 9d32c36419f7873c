"""Room across decode (and prefill) workers: a request one worker's pools cannot hold yet goes back to
the queue for a worker with room (its handoff, or its claim, fenced like every transition), where it
waited for one of its worker's own requests to end while another worker idled."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import redis

from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.prefill_loop import PrefillLoop
from dayzero.serving.prefilling import tokens_of
from dayzero.serving.registry import Registry
from dayzero.serving.room import Prefetch, Room, to_prefill
from dayzero.serving.runtime import Runtime
from dayzero.settings import Settings

from .conftest import MODEL, pool_usage, prompt_ids, recording, sse_events, start_stack, wait_until
from .in_process import engine_completer
from .prefill_jobs import admitted

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


def test_a_prefill_worker_hands_back_only_what_its_blocks_cannot_hold_and_nothing_under_way(demo_dir, redis_url):
    """Blocks for one 300-token prompt and a short one are left; a live peer's snapshot shows empty pools.
    In admission order: "dup" (300 tokens, 5 chunks of 64) delivered twice (the second waits: its
    blocks are this worker's), "big" (300) and "small" (5). "dup" starts; "big" goes back to prefill's
    queue (fenced: its lease dropped, a counted mark, so the reaper leaves it); "small" is kept and runs
    here; the second "dup", whose run is under way here, is never handed back (a peer would run it again)."""
    chunked = {"kv_budget_mb": 1, "max_batch": 4, "handoff_timeout_s": 600, "prefill_chunk_size": 64, "lease_s": 30}
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, **chunked)
    runtime, handed, sent = Runtime.load(settings, "prefill18@test", "prefill", False), [], []
    room = Room(runtime, Prefetch(), to_prefill(runtime, recording(handed, "prefill")))  # (its prefetch: unbound)
    loop = PrefillLoop(runtime, recording(sent), room)
    pools, store = runtime.pools, Lifecycle.connect(redis_url)
    runtime.ranks.reserve("elsewhere", pools.capacity_tokens() - 8 * 64)
    empty = {kind: [0, total] for kind, (_, total) in pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill19@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    dup, big = admitted(store, "p-dup", tuple(range(2, 302))), admitted(store, "p-big", tuple(range(3, 303)))
    tickets = [loop.intake.submit(job) for job in (dup, dup, big, admitted(store, "p-small"))]
    try:
        loop._iteration()
        assert [p.request_ids for p in loop.running] == [["p-dup"]] and not pools.fits(300) and pools.fits(5)
        assert [job.request.request_id for job in handed] == ["p-big"] and [t for t, _ in room.held] == [tickets[2]]
        assert store.owner("p-big") is None and store.r.get(key("queued", "p-big")).startswith(b"prefill:")
        assert store.rerun_orphan("p-big", 60, 60) == 0  # its message waits on the queue
        assert [t.job.request.request_id for t in loop.pending] == ["p-dup", "p-small"]  # in admission order
        assert store.owner("p-dup") == runtime.name and not tickets[1].done.is_set()
        loop._iteration()
        assert "p-small" in pools.sequences and tickets[3].done.wait(30)  # started here once "big" was gone
    finally:
        loop.stop.set()
    assert not tickets[1].done.is_set() and [job.request.request_id for job in handed] == ["p-big"]


def test_redis_failing_mid_hand_back_leaves_the_rest_waiting_and_the_handed_back_gone(demo_dir, redis_url):
    """Three prompts this worker's blocks cannot hold, a peer with room: the first goes back to the queue,
    Redis fails on the second's push. The first stays gone (its ticket held till it is let go: were
    it left waiting too, it would run here as well), the other two wait here, leased to this worker;
    nothing is raised."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, handed = Runtime.load(settings, "prefill20@test", "prefill", False), []
    push = to_prefill(runtime, recording(handed, "prefill"))

    def failing_second(job, rid: str) -> bool:
        if handed:
            raise redis.ConnectionError("Redis went away")
        return push(job, rid)

    room, store = Room(runtime, Prefetch(), failing_second), Lifecycle.connect(redis_url)
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())
    empty = {kind: [0, total] for kind, (_, total) in runtime.pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill21@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    tickets = [loop.intake.submit(admitted(store, f"f-{i}", tuple(range(2, 302)))) for i in range(3)]
    try:
        still = room.hand_back(loop.intake.drain(0), tokens_of, loop.heartbeat)
    finally:
        loop.stop.set()
    assert [t.job.request.request_id for t in still] == ["f-1", "f-2"]
    assert [job.request.request_id for job in handed] == ["f-0"]
    assert [t for t, _ in room.held] == tickets[:1] and not any(t.done.is_set() for t in tickets)  # held a while
    assert [store.owner(f"f-{i}") for i in range(3)] == [None, runtime.name, runtime.name]
    room.held = [(tickets[0], time.monotonic() - room.hold_s), (tickets[2], time.monotonic())]  # (as if f-2's later)
    room.consume(busy=True)  # each held a hold after its own push: f-0 let go, f-2 not yet (it was: the last push)
    assert tickets[0].done.is_set() and not tickets[2].done.is_set() and [t for t, _ in room.held] == tickets[2:]


def _read(client: redis.Redis, got: dict, name: str) -> None:
    """A worker's queue read: a BRPOP of prefill's queue, blocked in Redis till a message comes (or 30 s)."""
    got[name] = client.brpop(["prefill"], 30)


def test_a_worker_handing_back_ends_its_own_blocked_queue_read_first_so_a_peer_takes_the_message(demo_dir, redis_url):
    """This worker's consumer has a queue read blocked in Redis (sent while it could take messages),
    blocked longer than its idle peer's: Redis serves the reader blocked longest, so the prompt it
    handed back came straight back to it (a bounce: a claim and a push each). It now ends its own
    read first (a nil, which its consumer takes for a timeout) and the peer's read takes the prompt.
    The prompt's message stays held here (the worker, paused, takes no other) till ``hold_s`` after."""
    settings = Settings(checkpoint=demo_dir, redis_url=redis_url, kv_budget_mb=1, max_batch=4, lease_s=30)
    runtime, store, prefetch = (
        Runtime.load(settings, "prefill22@test", "prefill", False),
        Lifecycle.connect(redis_url),
        Prefetch(),
    )
    room = Room(runtime, prefetch, to_prefill(runtime, recording([], "prefill")))
    loop = PrefillLoop(runtime, recording([]), room)
    runtime.ranks.reserve("elsewhere", runtime.pools.capacity_tokens())
    empty = {kind: [0, total] for kind, (_, total) in runtime.pools.usage().items()}
    Registry(store.r).alive("prefill", "prefill23@test:peer", {"stage": "prefill", "pools": empty, "gauges": {}})
    store.r.delete("prefill")  # (what earlier tests left there)
    ticket = loop.intake.submit(admitted(store, "r-back", tuple(range(2, 302))))
    got, reads = {}, []
    for name in (prefetch.reads.name, "peer"):  # this worker's read blocks first
        reads.append(
            threading.Thread(target=_read, args=(redis.Redis.from_url(redis_url, client_name=name), got, name))
        )
        reads[-1].start()
        assert wait_until(lambda n=name: any(c["name"] == n and "b" in c["flags"] for c in store.r.client_list()), 10)
    try:
        assert room.hand_back(loop.intake.drain(0), tokens_of, loop.heartbeat) == []
        for read in reads:
            read.join(30)
        assert got[prefetch.reads.name] is None and got["peer"][0] == b"prefill"  # the peer has it, this worker not
        assert store.owner("r-back") is None and not ticket.done.is_set()  # its message held here a while
        room.hold_s = 0
        room.consume(busy=True)
        assert ticket.done.is_set() and not room.held
    finally:
        loop.stop.set()


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
        assert wait_until(lambda: len(Registry(r).live_workers("decode", 3)) == 2, 60)  # /ready needs only one
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


LONG_PROMPT = [(7 * k) % 500 + 2 for k in range(2900)]  # 46 of prefill's 55 CSA blocks: one at a time


def _completion(url: str, prompt: list[int], streams: dict, name: str) -> None:
    """A streamed greedy completion of 4 tokens: its request id first in ``streams[name]``, then its
    chunks' texts as they come."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        streams[name] = [r.headers["x-request-id"]]
        for _, data in sse_events(r):
            if data == "[DONE]":
                break
            streams[name].append(data["choices"][0]["text"])


def test_prompts_one_prefill_worker_cannot_start_go_to_the_one_with_room(text_dir, tmp_path):
    """prefill1 frozen, decode0 frozen (the handoffs wait, holding prefill's blocks): prefill0 prefills a
    long prompt, then claims a second its blocks cannot hold and two short ones behind it (first come,
    first served: they wait with it, for the first one's handoff to lapse, 120 s). prefill1 continued,
    prefill0 hands the long one back to the queue for it and starts the short ones itself: every first
    token comes while decode is still frozen. Each prompt was prefilled once, none re-run, and every
    text is the in-process engine's."""
    env = {**ROOM_ENV, "DAYZERO_HANDOFF_TIMEOUT_S": "120", "DAYZERO_LEASE_S": "3"}  # (a 1 s lease lapsed under load)
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 2, "decode": 1}, env)
    prefill1, decode0 = stack.child("prefill1").proc, stack.child("decode0").proc
    r, streams, threads = redis.Redis.from_url(stack.redis_url), {}, []
    prompts = {"first": LONG_PROMPT, "second": LONG_PROMPT, "short1": prompt_ids(1), "short2": prompt_ids(2)}

    def send(name: str) -> None:  # admitted and claimed by prefill0 before the next one
        threads.append(threading.Thread(target=_completion, args=(stack.url, prompts[name], streams, name)))
        threads[-1].start()
        lease = lambda: name in streams and r.get(key("lease", streams[name][0]))  # noqa: E731
        assert wait_until(lambda: lease() and lease().startswith(b"prefill0"), 30)

    def first_tokens() -> set[str]:  # those whose first token is in the stream (its text may wait for the next)
        return {name for name, (rid, *_) in streams.items() if r.xlen(key("tokens", rid))}

    def prefilled() -> dict[str, float]:  # prompt tokens each prefill worker has prefilled
        snaps = pool_usage(stack).items()
        return {name.partition("@")[0]: s["counters"].get("tokens", 0) for name, s in snaps if s["stage"] == "prefill"}

    try:  # prefill1 stopped while it loads would turn live as prefill0 claims: seen with room, handed to
        assert wait_until(lambda: len(Registry(r).live_workers("prefill", 3)) == 2, 60)  # (/ready needs one)
        decode0.send_signal(signal.SIGSTOP)
        prefill1.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: len(Registry(r).live_workers("prefill", 3.5)) == 1, 10)  # (past the lease: no peer)
        send("first")
        assert wait_until(lambda: first_tokens() == {"first"}, 60)  # its blocks stay till decode takes them
        for name in ("second", "short1", "short2"):
            send(name)
        time.sleep(1)  # prefill0 alone: they wait for the first one's blocks
        assert first_tokens() == {"first"}
        prefill1.send_signal(signal.SIGCONT)
        assert wait_until(lambda: len(first_tokens()) == 4, 30), first_tokens()
        shorts = len(prompts["short1"]) + len(prompts["short2"])  # each prompt prefilled once, where it could start
        expected = {"prefill0": len(LONG_PROMPT) + shorts, "prefill1": len(LONG_PROMPT)}
        assert wait_until(lambda: prefilled() == expected, 10), prefilled()
        decode0.send_signal(signal.SIGCONT)
        for thread in threads:
            thread.join(120)
        reference = engine_completer(text_dir, "cpu")
        expected = {name: reference(prompt, 4) for name, prompt in prompts.items() if name != "second"}
        expected["second"] = expected["first"]  # the same prompt, greedy: one run (~35 s on a loaded CPU)
        for name, (rid, *texts) in streams.items():
            assert "".join(texts) == expected[name], name
            assert int(r.get(key("attempt", rid)) or 0) == 0, name  # never re-run
    finally:
        prefill1.send_signal(signal.SIGCONT)
        decode0.send_signal(signal.SIGCONT)
        for thread in threads:
            thread.join(60)
        stack.stop()
