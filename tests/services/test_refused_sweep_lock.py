"""A refusal met under the sweep's lock, lifted while another user's gateway holds that lock at the
refused gateway's passes (its own period, the lock taken for 0.9 of it: the refused gateway wins only
in the tenth after the lock lapses). A real Redis and its ACL, the gateway in-process, the other
gateway a thread that takes the lock as the sweep does."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.procs import free_port, scratch_redis
from dayzero.redis_refusals import command_refused
from dayzero.serving.keys import key
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.reaper import MAX_ATTEMPTS, sweep
from dayzero.serving.scripts import Take
from services.gateway import reaping, refused_commands

from .conftest import wait_until
from .lifecycle_requests import request
from .sweep_stand_ins import ActiveRead, sweep_sending_lrange_under_its_lock
from .test_refused_command_state import GRANTS, _gateway, _reason, _redis

LEASE_S = 1.0  # a period of 0.5 s: the refused gateway's pass drifts a few ms a period against the other's
PERIOD_S = LEASE_S / 2
LOCK_MS = int(PERIOD_S * 900)  # (as reaping.py takes it)
RECORD = key("refused", "dz")  # (the refusals' record of the gateway's user)


@contextlib.contextmanager
def _other_gateway_sweeping(client: redis.Redis, first_s: float) -> Iterator[list[bool]]:
    """Another gateway's sweeps: the lock taken at ``first_s`` (monotonic), then each period after (NX,
    as sweep() takes it). -> whether each take won, as they come. Stopped after."""
    takes, stop = [], threading.Event()

    def sweeps() -> None:
        k = 0
        while not stop.wait(max(0.0, first_s + k * PERIOD_S - time.monotonic())):
            takes.append(bool(client.set(key("reaper"), "other", px=LOCK_MS, nx=k > 0)))  # (the first: it has it)
            k += 1

    thread = threading.Thread(target=sweeps)
    thread.start()
    try:
        yield takes
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def tries(monkeypatch) -> list[float]:
    """When each of the gateway's sweeps was tried (the stand-in sweep: LRANGE sent under its lock)."""
    tried = []

    def sweep_tried_at(*args):
        tried.append(time.monotonic())
        return sweep_sending_lrange_under_its_lock(*args)

    monkeypatch.setattr(reaping, "sweep", sweep_tried_at)
    return tried


def test_a_lifted_refusal_is_cleared_within_a_few_periods_while_another_users_gateway_sweeps(demo_dir, tmp_path, tries):
    """The other gateway takes the lock just before each of this one's tries: this gateway
    skipped the sweep where the refusal was met, held it, and met the lock's tenth-of-a-period window
    only as its pass drifted into it (a fresh gateway, real Redis: 40 periods; 5-13 min at the default
    lease). Its pass after one that found the lock held is timed to the lock's expiry now: the refusal,
    lifted, is cleared within a few of the other's sweeps."""
    port = free_port()
    with (
        _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client),
        _gateway(port, demo_dir, lease_s=LEASE_S) as gateway,
    ):
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "'lrange'" in _reason(gateway), 15), _reason(gateway)
        # (the refused sweep failed its pass: re-runs off for a lease, this gateway's next try 3 periods on)
        with _other_gateway_sweeping(client, tries[-1] + 2.9 * PERIOD_S) as takes:
            assert wait_until(lambda: takes, 15)
            client.acl_setuser("dz", commands=["+@all"], **GRANTS)
            assert wait_until(lambda: "user a command" not in _reason(gateway) or len(takes) > 6, 30)
            sweeps_till_cleared = len(takes)
    assert sweeps_till_cleared <= 6, (sweeps_till_cleared, takes)


def test_a_sweep_lock_without_expiry_does_not_spin_the_refused_gateways_passes(demo_dir, tmp_path, tries):
    """The pass after a lost sweep waits to the lock's lapse (PTTL); a lock without one (PTTL -1: set
    by hand, or PERSISTed) read as free: the next pass 1 ms on, lost again, for as long as the lock
    stays (a refused gateway: hundreds of passes a second, ten round trips each). It waits a period."""
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "'lrange'" in _reason(gateway), 15), _reason(gateway)
        client.set(key("reaper"), "held by hand")  # (no expiry)
        time.sleep(3.0)  # (re-runs off for a lease after the refused pass, then a try each period: ~12)
        since = time.monotonic() - 2.0
        recent = [at for at in tries if at >= since]
    assert len(recent) <= 15, len(recent)


@contextlib.contextmanager
def _pttl_refused_under_anothers_lock(demo_dir, tmp_path) -> Iterator[tuple[redis.Redis, TestClient]]:
    """The gateway refused LRANGE under the sweep's lock, then the lock another's and PTTL refused too,
    till that refusal is in the record. -> the default user's client, the gateway."""
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "'lrange'" in _reason(gateway), 15), _reason(gateway)
        client.set(key("reaper"), "another gateway", px=60_000)
        client.acl_setuser("dz", commands=["+@all", "-lrange", "-pttl"], **GRANTS)
        assert wait_until(lambda: client.hexists(RECORD, "pttl"), 15), client.hkeys(RECORD)
        yield client, gateway


def test_a_refused_pttl_is_cleared_once_redis_answers_it(demo_dir, tmp_path, tries, monkeypatch):
    """The lock's PTTL, read after the pass settled its commands, went unsettled when answered: refused
    once, it was cleared only by its lapse (5 periods; 1,000 here: for ever), /ready refused and every
    new request 503 though Redis answered it at every pass that held the sweep's refusal."""
    monkeypatch.setattr(refused_commands, "HELD_PASSES", 1000)
    with _pttl_refused_under_anothers_lock(demo_dir, tmp_path) as (client, gateway):
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: not client.hexists(RECORD, "pttl"), 15), client.hkeys(RECORD)
        assert "'lrange'" in _reason(gateway), _reason(gateway)


def test_a_refused_pttl_fails_no_pass_and_is_said_once(demo_dir, tmp_path, tries, monkeypatch, caplog):
    """The lock's PTTL times only the next pass (a refusal met under the lock held, the lock another's):
    refused, it failed the pass whose steps had all gone through, counted an outage (the no-worker
    counts begun again at the next, re-runs off for a lease, the stages past their bound forgotten).
    The record's write (LENGTHEN) read its TTL too: refused there, the script's refusal was said beside
    PTTL's. Now the next pass comes a period on, as it would without the read, and the refusal is said once."""
    counted_again = []
    monkeypatch.setattr(reaping, "count_again", lambda *args: counted_again.append(args))
    caplog.set_level(logging.WARNING, "dayzero.redis")
    with _pttl_refused_under_anothers_lock(demo_dir, tmp_path) as (client, _):
        counted_again.clear()  # (the lrange-refused sweeps' outages: counted before the lock was held)
        tried = len(tries)
        assert wait_until(lambda: len(tries) >= tried + 4, 15), tries
        assert client.hexists(RECORD, "pttl"), client.hkeys(RECORD)
    assert counted_again == []
    said = [line.getMessage() for line in caplog.records if "is refused a command" in line.getMessage()]
    assert len(said) == 2 and "'lrange'" in said[0] and "'pttl'" in said[1], said


def test_a_sweep_refused_a_command_gives_its_lock_back(tmp_path):
    """A sweep refused a command (ACL -smembers: this user's alone) kept the lock it took for 0.9 of a
    period, sweeping nothing: the refused gateway's pass timed to the lock's lapse won every sweep it
    tried (bench/refused_sweep_lock.py: 7-8 of ~24 a 5 s window, 3-5 before the timing), and the other
    gateway, which may run it, swept only the periods left. The lock is free once the sweep fails so."""
    with scratch_redis(tmp_path) as port:
        admin = redis.Redis(port=port)
        admin.acl_setuser("dz", commands=["+@all", "-smembers"], **GRANTS)
        store = Lifecycle(redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            sweep(store, lambda job, stage: None, 30.0, 60_000, 10.0)
        assert not admin.exists(key("reaper")), admin.pttl(key("reaper"))
        admin.set(key("reaper"), "another gateway", px=60_000)
        assert sweep(store, lambda job, stage: None, 30.0, 60_000, 10.0) is None
        assert admin.get(key("reaper")) == b"another gateway"
        store.r.close()
        admin.close()


def test_a_refused_sweep_leaves_a_lock_another_gateway_took_meanwhile(tmp_path):
    """The give-back deletes the lock only where it is still this sweep's: one that lapsed mid-sweep and
    was taken by another gateway is that one's (deleted, a third gateway could sweep beside it). The
    give-back test above takes no lock another holds (its sweep returns None): a DEL of whatever the lock
    holds passed it."""
    with scratch_redis(tmp_path) as port:
        admin = redis.Redis(port=port)
        admin.acl_setuser("dz", commands=["+@all", "-smembers"], **GRANTS)
        store = Lifecycle(redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0"))
        taken = ActiveRead(store, lambda: admin.set(key("reaper"), "another gateway", px=60_000))
        with pytest.raises(redis.exceptions.NoPermissionError):
            sweep(taken, lambda job, stage: None, 30.0, 60_000, 10.0)
        assert admin.get(key("reaper")) == b"another gateway"
        store.r.close()
        admin.close()


def test_a_refused_sweep_that_sighted_a_request_keeps_its_lock(tmp_path):
    """A sweep's first sighting of a message taken off its queue and not yet claimed re-runs nothing: a
    live worker's claim may be just behind its pop, and the next sweep (the lock's 0.9 of a period on)
    re-runs it. A sweep refused a command after such a sighting (ACL -mget: the re-run's cancel check)
    gave its lock back, and another user's gateway sweeping just after re-ran the request, its live
    worker's claim stale (prefilled twice). It keeps the lock; one refused before it looked at any
    request gives it back (above)."""
    with scratch_redis(tmp_path) as port:
        admin = Lifecycle(redis.Redis(port=port))
        admin.r.acl_setuser("dz", commands=["+@all", "-mget"], **GRANTS)
        admin.admit(request("a-live"), [], "", 60)
        admin.enqueue("a-live", "prefill", "a-live", 60)
        assert admin.r.rpop("prefill") == b"a-live"  # a live worker took it, its claim not yet made
        admin.admit(request("b-dead"), [], "", 60)
        admin.take("b-dead", 0, "decode0", 30)
        admin.r.delete(key("lease", "b-dead"))  # its worker died
        store = Lifecycle(redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0"))
        with pytest.raises(redis.exceptions.NoPermissionError):  # (a-live sighted, b-dead's re-run refused)
            sweep(ActiveRead(store), lambda job, stage: None, 30.0, 60_000, 60.0)
        assert sweep(ActiveRead(admin), lambda job, stage: None, 30.0, 60_000, 60.0) is None
        assert admin.take("a-live", 0, "prefill1", 30) == Take.CLAIMED
        store.r.close()
        admin.r.close()


def orphan_of_a_dead_worker(port: int, refused: str) -> tuple[Lifecycle, Lifecycle]:
    """Request ``dead`` taken by a decode worker that died (its lease gone), and the ACL user dz refused
    the command ``refused``. -> the admin's store, and dz's."""
    admin = Lifecycle(redis.Redis(port=port))
    admin.r.acl_setuser("dz", commands=["+@all", f"-{refused}"], **GRANTS)
    admin.admit(request("dead"), [], "", 60)
    admin.take("dead", 0, "decode0", 30)
    admin.r.delete(key("lease", "dead"))
    return admin, Lifecycle(redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0"))


def test_a_rerun_refused_its_records_pttl_writes_nothing(tmp_path):
    """The re-run script read the request's record TTL (its attempt's life) after its writes: refused
    (ACL -pttl), it had dropped the dead worker's lease, marked the request queued and counted an
    attempt, and sent nothing; each sweep after the mark's lapse counted one more, and once the ACL
    allowed PTTL the request ended 'failed on several workers', never run again. Refused there, it
    writes nothing now: the sweep once the ACL allows PTTL re-runs it as attempt 1."""
    with scratch_redis(tmp_path) as port:
        admin, store = orphan_of_a_dead_worker(port, "pttl")
        sent = []
        for _ in range(MAX_ATTEMPTS + 1):  # (a queued mark of 1 ms: lapsed at the next sweep)
            with pytest.raises(redis.ResponseError) as refused:
                sweep(store, lambda job, stage: sent.append(job.attempt), 0.001, 60_000, 10.0)
            assert command_refused(refused.value), refused.value
            assert wait_until(lambda: not admin.r.exists(key("queued", "dead")), 5)
        admin.r.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert sweep(store, lambda job, stage: sent.append(job.attempt), 30.0, 60_000, 10.0) == ["dead"]
        assert sent == [1]
        store.r.close()
        admin.r.close()


def test_a_rerun_refused_its_attempts_pexpire_counts_nothing(tmp_path):
    """The re-run script counted the attempt (INCR) and then gave it the record's life (PEXPIRE):
    refused that (ACL -pexpire), it had dropped the lease, marked the request queued and counted an
    attempt, sending nothing, one more at each sweep after the mark's lapse: the request ended 'failed on
    several workers' without a re-run. The attempt is one SET with its life now: the sweep re-runs it."""
    with scratch_redis(tmp_path) as port:
        admin, store = orphan_of_a_dead_worker(port, "pexpire")
        sent = []
        assert sweep(store, lambda job, stage: sent.append(job.attempt), 30.0, 60_000, 10.0) == ["dead"]
        assert sent == [1]
        record_ms = admin.r.pttl(key("req", "dead"))  # (first: the attempt's, read after, is no longer)
        assert 0 < admin.r.pttl(key("attempt", "dead")) <= record_ms
        store.r.close()
        admin.r.close()
