"""The transitions against a real Redis: each is one round trip and leaves the keys it promises (the
token stream's: test_stream_scripts.py)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
import redis
import redis.asyncio as aioredis

from dayzero.serving import queue_scripts, scripts, stream_scripts
from dayzero.serving.admission import Queue, Record
from dayzero.serving.keys import HANDOFF_OWNER, key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.scripts import Take
from dayzero.serving.watching import Watching

from .lifecycle_requests import request


def test_take_claims_a_free_request_once_and_lets_its_owner_take_it_again(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.set(key("queued", "c1"), 1)
    assert store.take("c1", 0, "prefill0", 30) == Take.CLAIMED
    assert store.owner("c1") == "prefill0" and not store.r.exists(key("queued", "c1"))
    assert store.take("c1", 0, "prefill0", 30) == Take.CLAIMED  # the owner retries its batch
    store.r.set(key("queued", "c1"), 1)
    assert store.take("c1", 0, "prefill1", 30) == Take.OWNED  # a live owner keeps it
    assert store.owner("c1") == "prefill0" and store.r.exists(key("queued", "c1"))


def test_a_take_by_the_owner_again_starts_its_lease_afresh(redis_url):
    """A request waiting for blocks is taken again every few iterations: its lease must not run
    down meanwhile (it lapsed under load, the reaper re-ran a request being prefilled)."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    assert store.take("f1", 0, "prefill0", 30) == Take.CLAIMED
    store.r.pexpire(key("lease", "f1"), 100)  # most of the lease gone
    assert store.take("f1", 0, "prefill0", 30) == Take.CLAIMED
    assert store.r.pttl(key("lease", "f1")) > 25_000


def test_a_run_that_is_over_hands_nothing_off(redis_url):
    """Its lease lapsed and the request was re-run, another worker took the lapsed lease, or the
    request ended: no handoff mark, no lease, no job. A lease that lapsed unnoticed still hands off."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.delete("decode")
    for rid in ("h-rerun", "h-taken", "h-ended", "h-lapsed"):
        store.admit(request(rid), [], "", 60)
        assert store.take(rid, 0, "prefill0", 30) == Take.CLAIMED
        store.r.delete(key("lease", rid))
    assert store.rerun_orphan("h-rerun", 60, 60) == 1
    assert store.take("h-taken", 0, "prefill1", 30) == Take.CLAIMED
    store.settle("h-ended", 0, "prefill0", "cancelled")
    ids = ("h-rerun", "h-taken", "h-ended", "h-lapsed")
    handed = [store.hand_off(rid, 0, "prefill0", 60, "decode", rid) for rid in ids]
    assert handed == [False, False, False, True]
    assert [store.owner(rid) for rid in ("h-rerun", "h-taken", "h-ended")] == [None, "prefill1", None]
    assert not any(store.r.exists(key("handoff", rid)) for rid in ("h-rerun", "h-taken", "h-ended"))
    assert store.r.lrange("decode", 0, -1) == [b"h-lapsed"] and store.owner("h-lapsed") == HANDOFF_OWNER


def test_rerun_orphan_requeues_only_an_unfinished_request_nobody_holds(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    ids = ("o-queued", "o-leased", "o-ended", "o-expired", "o-orphan")
    for rid in ids:
        store.admit(request(rid), [], "", 60)
    for rid in ids[1:]:
        store.take(rid, 0, "decode0", 30)
    store.settle("o-ended", 0, "decode0", "stop")
    store.r.delete(key("req", "o-expired"), key("lease", "o-expired"))  # its record expired
    store.r.sadd(key("active"), "o-ended")  # as if the reaper read the set just before the end
    store.r.delete(key("lease", "o-orphan"))  # its worker died
    assert [store.rerun_orphan(rid, 60, 60) for rid in ids] == [0, 0, 0, 0, 1]
    assert store.r.exists(key("queued", "o-orphan")) and store.rerun_orphan("o-orphan", 60, 60) == 0  # queued now
    active = set(store.active())
    assert {"o-queued", "o-leased", "o-orphan"} <= active and not {"o-ended", "o-expired"} & active
    record_ttl = store.r.ttl(key("req", "o-orphan"))  # the attempt lives as long as the record
    assert record_ttl > 60 and record_ttl - 2 <= store.r.ttl(key("attempt", "o-orphan")) <= record_ttl
    assert store.settle("o-orphan", 1, "prefill0", "stop")  # then as long as the stream
    assert 0 < store.r.ttl(key("attempt", "o-orphan")) <= store.ttl_s


def test_a_message_a_worker_took_and_never_claimed_is_re_run_at_the_next_sweep(redis_url):
    """A queued request's mark counts its message on its queue. While the message waits there, the
    reaper leaves the request alone. Once a worker has taken the message off the queue and died
    before its claim, the second sweep that finds it so re-runs the request, not the mark's lapse
    (an hour). The first only sights it: a live worker's claim may be just behind its pop (the
    third message's, here), and a re-run then would prefill the request twice. A claimed request
    is its claimant's; a late claim of the old delivery is stale."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.delete("prefill", key("pushed", "prefill"))

    async def admit() -> None:  # as the gateway admits: the message pushed with the records
        client = aioredis.Redis.from_url(redis_url)
        await Watching(client, 60, 60).admit([Record.of(request("m-first"))], [], "r", Queue("prefill", ("m-first",)))
        await client.aclose()

    asyncio.run(admit())
    store.admit(request("m-second"), [], "", 60)  # recorded, then queued as vision hands it on
    store.enqueue("m-second", "prefill", "m-second", 60)
    store.admit(request("m-third"), [], "", 60)
    store.enqueue("m-third", "prefill", "m-third", 60)
    ids = ("m-first", "m-second", "m-third")
    assert [store.rerun_orphan(rid, 60, 60) for rid in ids] == [0, 0, 0]  # each message waits in the queue
    assert store.r.rpop("prefill") == b"m-first"  # a worker takes the oldest, and dies
    assert store.r.rpop("prefill") == b"m-second"  # another takes the next and claims it
    assert store.take("m-second", 0, "prefill1", 30) == Take.CLAIMED
    assert store.r.rpop("prefill") == b"m-third"  # a live worker takes the third, its claim not yet made
    assert [store.rerun_orphan(rid, 60, 60) for rid in ids] == [0, 0, 0]  # sighted: first and third
    assert store.take("m-third", 0, "prefill1", 30) == Take.CLAIMED  # the third's claim comes
    assert [store.rerun_orphan(rid, 60, 60) for rid in ids] == [1, 0, 0]
    assert store.take("m-first", 0, "prefill0", 30) == Take.STALE  # the dead worker's claim, had it come
    assert store.rerun_orphan("m-first", 60, 60) == 0  # its re-run is on its way: queued, not yet pushed
    store.enqueue("m-first", "prefill", "m-first again", 60)
    assert store.r.lrange("prefill", 0, -1) == [b"m-first again"]
    assert store.rerun_orphan("m-first", 60, 60) == 0  # its new message waits in the queue
    assert store.r.rpop("prefill") == b"m-first again"
    assert store.rerun_orphan("m-first", 60, 60) == 0 and store.take("m-first", 1, "prefill1", 30) == Take.CLAIMED


def test_a_handoff_decode_took_and_never_claimed_is_re_run_at_the_next_sweep(redis_url):
    """The handoff's mark counts decode's message too. While the message waits on decode's queue,
    the handoff's lease keeps the reaper away. Once a decode worker has taken it and died before its
    claim, the second sweep that finds it so re-runs the request (lease and handoff dropped: the
    re-run's prefill may claim it), not the handoff's lapse. One decode claimed is decode's, even
    when a sweep came between its pop and its claim."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.delete("decode", key("pushed", "decode"))
    for rid in ("d-lost", "d-claimed", "d-waits"):
        store.admit(request(rid), [], "", 60)
        assert store.take(rid, 0, "prefill0", 30) == Take.CLAIMED
        assert store.hand_off(rid, 0, "prefill0", 60, "decode", rid)
    assert [store.rerun_orphan(rid, 60, 60) for rid in ("d-lost", "d-claimed", "d-waits")] == [0, 0, 0]
    assert store.r.rpop("decode") == b"d-lost"  # a decode worker takes it, and dies
    assert store.r.rpop("decode") == b"d-claimed"  # another takes the next, and claims it after a sweep
    assert [store.rerun_orphan(rid, 60, 60) for rid in ("d-lost", "d-claimed", "d-waits")] == [0, 0, 0]
    assert store.take("d-claimed", 0, "decode1", 30, handed_off=True) == Take.CLAIMED
    assert [store.rerun_orphan(rid, 60, 60) for rid in ("d-lost", "d-claimed", "d-waits")] == [1, 0, 0]
    assert store.owner("d-lost") is None and not store.r.exists(key("handoff", "d-lost"))
    assert store.take("d-lost", 0, "decode0", 30, handed_off=True) == Take.STALE  # its late claim
    assert store.take("d-lost", 1, "prefill1", 30) == Take.CLAIMED  # the re-run's


def test_take_drops_stale_and_ended_deliveries_and_reports_a_cancel(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.set(key("attempt", "s1"), 2)
    assert store.take("s1", 1, "prefill0", 30) == Take.STALE and store.owner("s1") is None
    assert store.take("s1", 2, "prefill0", 30) == Take.CLAIMED
    store.r.set(key("done", "s2"), "finished")
    assert store.take("s2", 0, "prefill0", 30) == Take.STALE and store.owner("s2") is None
    store.cancel("s3")
    assert store.take("s3", 0, "prefill0", 30) == Take.CANCELLED and store.owner("s3") == "prefill0"


def test_heartbeat_refreshes_only_its_own_leases_and_names_the_ones_it_lost(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    for rid in ("b1", "b2", "b3"):
        store.take(rid, 0, "decode0", 30)
    store.r.pexpire(key("lease", "b1"), 100)
    store.r.set(key("lease", "b2"), "decode1")  # it lapsed and was re-run elsewhere
    store.r.delete(key("lease", "b3"))  # lapsed, or gone with Redis's data
    runs = {"b1": 0, "b2": 0, "b3": 0}
    assert store.heartbeat(["b1", "b2", "b3"], "decode0", 30, runs) == ["b2", "b3"]
    assert store.r.pttl(key("lease", "b1")) > 10_000  # refreshed
    assert store.owner("b2") == "decode1" and store.owner("b3") is None  # never taken back, never made
    assert store.heartbeat([], "decode0", 30, {}) == []


def _two_leases_of_5_s(redis_url: str) -> tuple[Lifecycle, list[str]]:
    """Leases k1 and k2 held by decode0, 5 s left each; -> the store and their HEARTBEAT keys."""
    store = Lifecycle(redis.Redis.from_url(redis_url))
    for rid in ("k1", "k2"):
        store.take(rid, 0, "decode0", 30)
        store.r.pexpire(key("lease", rid), 5_000)
    return store, [key(family, rid) for rid in ("k1", "k2") for family in ("lease", "attempt", "done", "queued", "req")]


@pytest.mark.parametrize(
    "leases, tail",
    [(2, [0]), (1, [0] * 2), (3, [0] * 3), (2, [0] * 3), ("x", [0] * 2)],  # the keys are two leases of 5
)
def test_a_heartbeat_whose_keys_are_not_whole_leases_is_refused_and_refreshes_none(redis_url, leases, tail):
    """A lease count that disagreed with the keys read one request's keys as another's (a lease key taken
    for a parked state, a lease refreshed for a run it was not given) and left leases unread and not
    lost. Now the script refuses and writes nothing."""
    store, keys = _two_leases_of_5_s(redis_url)
    with pytest.raises(redis.ResponseError, match="are not .* leases of 5 keys"):
        store._heartbeat(keys=keys, args=["decode0", 30_000, leases, *tail])
    assert all(store.r.pttl(key("lease", rid)) <= 5_000 for rid in ("k1", "k2"))  # neither refreshed


@pytest.mark.parametrize("of", [0, 3, "x"])
def test_a_heartbeat_naming_a_state_by_no_lease_of_its_own_is_refused(redis_url, of):
    """A parked state named by a lease the beat does not hold (0, past the last, not a number) would be
    kept alive for no request, or not at all: refused, nothing written."""
    store, keys = _two_leases_of_5_s(redis_url)
    with pytest.raises(redis.ResponseError, match="named by their lease"):
        store._heartbeat(keys=[*keys, key("kvstate", "k1")], args=["decode0", 30_000, 2, 0, 0, of])
    assert all(store.r.pttl(key("lease", rid)) <= 5_000 for rid in ("k1", "k2"))


def test_take_loads_its_script_again_after_a_flush(redis_url):
    store = Lifecycle(redis.Redis.from_url(redis_url))
    store.r.script_flush()  # what a restarted Redis has forgotten
    assert store.take("c2", 0, "prefill0", 30) == Take.CLAIMED


def test_admit_queues_every_request_or_none_within_the_bound(redis_url):
    async def run() -> tuple[bool, bool]:
        client = aioredis.Redis.from_url(redis_url)
        watching = Watching(client, stream_ttl_s=60, queued_s=60)
        a, b = [Record.of(request(rid)) for rid in ("a1", "a2")], [Record.of(request(rid)) for rid in ("a3", "a4")]
        first = await watching.admit(a, [b"img"], "r", Queue("q", ("m1", "m2"), 3))
        again = await watching.admit(a, [b"img"], "r", Queue("q", ("m1", "m2"), 9))
        second = await watching.admit(b, [], "r", Queue("q", ("m3", "m4"), 3))
        await client.aclose()
        return first and again, second

    first, second = asyncio.run(run())
    store = Lifecycle(redis.Redis.from_url(redis_url))
    assert first and not second  # 2 + 2 messages would pass the bound of 3: neither of the second pair
    assert store.r.lrange("q", 0, -1) == [b"m2", b"m1"]  # admitted again (a retry): nothing more written
    assert store.request("a2") == request("a2") and store.images("a1") == [b"img"] == store.images("a2")
    assert store.r.get(key("access", "a1")) == b"r" and store.r.pttl(key("queued", "a1")) > 0
    assert set(store.active()) >= {"a1", "a2"} and store.request("a3") is None and "a3" not in store.active()


def test_a_record_outlives_the_longest_generation_and_its_stream_after_the_end(redis_url):
    """Admitted with the settings' visibility timeout, a request's record outlives a wait in the
    queue plus a generation at the task time limit (it was 4 stream TTLs: 40 min against a 1 h
    limit); once settled it lives as long as its stream."""
    from dayzero.settings import Settings

    settings = Settings()
    store = Lifecycle(redis.Redis.from_url(redis_url), settings.stream_ttl_s)
    store.admit(request("long1"), [b"img"], "r", settings.visibility_timeout_s)
    for family in ("req", "access", "images"):
        assert store.r.ttl(key(family, "long1")) >= settings.visibility_timeout_s + settings.task_time_limit_s
    store.settle("long1", 0, "", "stop")
    for family in ("req", "access", "images"):
        assert 0 < store.r.ttl(key(family, "long1")) <= settings.stream_ttl_s


def test_load_scripts_loads_every_transition_before_a_request_needs_one(redis_url):
    """Workers load the scripts before they announce themselves: a script left out would cost a
    request two more round trips (NOSCRIPT, load, call again) on its way."""
    client = redis.Redis.from_url(redis_url)
    client.script_flush()
    Lifecycle(client).load_scripts()
    sources = (scripts.TAKE, scripts.HAND_ON, scripts.HAND_OFF, scripts.HAND_BACK, scripts.TAKE_HANDOFFS)
    sources += (scripts.HEARTBEAT, stream_scripts.APPEND, stream_scripts.SETTLE, queue_scripts.ADMIT)
    sources += (queue_scripts.ENQUEUE, queue_scripts.RERUN)
    shas = [hashlib.sha1(source.encode()).hexdigest() for source in sources]
    assert client.script_exists(*shas) == [True] * len(shas)
