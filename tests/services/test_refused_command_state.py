"""What /ready and the log say of a command the gateway's Redis user is refused (an ACL's NOPERM), met
by its reaper's passes, while the passes that send it come and go, and while Redis goes and comes back.
A real Redis and its ACL, the gateway in-process (its reaper's loop as it runs), no workers."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from dayzero.procs import free_port, start_redis
from dayzero.serving.keys import key
from dayzero.settings import Settings
from services.gateway import reaping, refused_commands
from services.gateway.app import make_app

from .conftest import wait_until
from .sweep_stand_ins import sweep_sending_lrange_under_its_lock

GRANTS = {"enabled": True, "passwords": ["+pw"], "keys": ["*"], "channels": ["*"]}
LEASE_S = 0.4  # a reaper pass every 0.2 s; after a failed one, no re-run for 0.4 s


def _reason(gateway: TestClient) -> str:
    return gateway.get("/ready").json().get("reason", "")


def _reasons_for(gateway: TestClient, seconds: float) -> list[str]:
    """/ready's reasons, asked every 0.1 s for ``seconds``."""
    reasons, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        reasons.append(_reason(gateway))
        time.sleep(0.1)
    return reasons


@contextlib.contextmanager
def _redis(port: int, log: Path, commands: list[str]) -> Iterator[tuple[subprocess.Popen, redis.Redis]]:
    """A Redis on ``port`` whose user ``dz`` an ACL grants ``commands``; -> its process and its default
    user's client. Stopped after (unless the test stopped it)."""
    server = start_redis(port, log)
    try:
        client = redis.Redis(port=port)
        client.acl_setuser("dz", commands=commands, **GRANTS)
        yield server, client
    finally:
        server.terminate()
        server.wait()


@contextlib.contextmanager
def _gateway(port: int, checkpoint: Path, user: str = "dz", lease_s: float = LEASE_S) -> Iterator[TestClient]:
    url = f"redis://{user}:pw@127.0.0.1:{port}/0"
    settings = Settings(redis_url=url, checkpoint=checkpoint, lease_s=lease_s, credentials_refused_s=600)
    with TestClient(make_app(settings)) as gateway:
        yield gateway


def test_ready_says_an_outage_after_a_refusal_then_the_refusal_again_then_no_refusal(demo_dir, tmp_path):
    """Redis down after an ACL refused the reaper's sweep a command: /ready kept the refusal's reason
    for the whole outage (the passes failing on it leave the refusal as it was), where it now says
    Redis is unreachable; back, the refusal again (the same ACL), then none once the ACL allows it."""
    port, log = free_port(), tmp_path / "redis.log"
    with _redis(port, log, ["+@all"]) as (server, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-smembers"], **GRANTS)  # (the sweep's, and others')
        assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
        server.terminate()
        server.wait()
        assert wait_until(lambda: _reason(gateway).startswith("redis unreachable"), 15), _reason(gateway)
        with _redis(port, log, ["+@all", "-smembers"]) as (_, client):
            assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
            assert "'smembers'" in _reason(gateway)
            client.acl_setuser("dz", commands=["+@all"], **GRANTS)
            assert wait_until(lambda: _reason(gateway).startswith("no live worker"), 15), _reason(gateway)


def test_a_command_refused_at_a_step_some_passes_skip_is_said_once_and_kept_till_it_goes_through(
    demo_dir, tmp_path, monkeypatch, caplog
):
    """A command only the re-run step sends (as a sweep's re-runs do; a stand-in's LRANGE here), which
    the passes skip for a lease after one that failed: the first pass that skipped it took the refusal
    back ("takes the gateway's commands again", /ready healthy), the next that ran it said it again,
    every few passes. Now it is said once and kept, /ready's reason throughout, till the step goes through."""
    sweep = reaping.sweep

    def sweep_sending_its_own_command(store, *args):
        store.r.lrange(key("sweep-only"), 0, 0)
        return sweep(store, *args)

    monkeypatch.setattr(reaping, "sweep", sweep_sending_its_own_command)
    caplog.set_level(logging.WARNING, "dayzero.redis")
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
        reasons = _reasons_for(gateway, 3.0)  # (15 passes, 7 leases)
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert wait_until(lambda: "user a command" not in _reason(gateway), 15), _reason(gateway)
    assert all("'lrange'" in reason for reason in reasons), reasons
    said = [record.getMessage() for record in caplog.records]
    assert sum("is refused a command dayzero sends" in line for line in said) == 1, said
    assert sum("takes the gateway's commands again" in line for line in said) == 1, said


def test_a_refusal_met_at_a_step_is_taken_back_once_redis_takes_it_though_the_step_fails_otherwise(
    demo_dir, tmp_path, monkeypatch
):
    """A step refused a command (LRANGE, a stand-in's) that, once the ACL allows it, fails past it on
    something else every pass (a record it cannot read: logged once, the other steps go on). The
    refusal was kept till that step went through, so for ever: /ready said the user was refused a
    command Redis now took, and every new request was answered 503. It is taken back at once now."""

    def sweep_failing_past_its_own_command(store, *args):
        store.r.lrange(key("sweep-only"), 0, 0)
        raise ValueError("a record the sweep cannot read")

    monkeypatch.setattr(reaping, "sweep", sweep_failing_past_its_own_command)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert wait_until(lambda: _reason(gateway).startswith("no live worker"), 15), _reason(gateway)


def test_two_gateways_say_a_refusal_their_sweep_meets_after_its_lock_steadily_till_it_is_allowed(
    demo_dir, tmp_path, monkeypatch
):
    """Two gateways on one Redis, whose sweep sends a refused command (a stand-in's LRANGE) once it holds
    the sweep's lock: the one that found the lock held sent none of the sweep's commands yet counted the
    sweep as run, and took the refusal back; both /ready flapped. The refusal is one record for both
    now: said throughout by each, and gone from both once the ACL allows it."""
    sweep = reaping.sweep

    def sweep_sending_its_own_command_under_the_lock(store, send, transit_s, lock_ms, *args):
        if not store.r.set(key("reaper"), 1, px=int(LEASE_S * 1000), nx=True):  # (held past the other's pass)
            return None  # (the other gateway sweeps)
        store.r.lrange(key("sweep-only"), 0, 0)
        store.r.delete(key("reaper"))  # (the real sweep's lock again: it takes it the same way)
        return sweep(store, send, transit_s, lock_ms, *args)

    monkeypatch.setattr(reaping, "sweep", sweep_sending_its_own_command_under_the_lock)
    port = free_port()
    with (
        _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client),
        _gateway(port, demo_dir) as first,
        _gateway(port, demo_dir) as second,
    ):
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "'lrange'" in _reason(first) and "'lrange'" in _reason(second), 15)
        reasons, until = [], time.monotonic() + 3.0  # (15 passes of each)
        while time.monotonic() < until:
            reasons += [_reason(first), _reason(second)]
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert wait_until(lambda: not any("user a command" in _reason(gw) for gw in (first, second)), 15)
    assert all("'lrange'" in reason for reason in reasons), reasons


def test_a_refusal_the_record_cannot_be_cleared_of_is_taken_back_and_the_records_own_said(
    demo_dir, tmp_path, monkeypatch
):
    """The ACL refusing the record's HDEL too: the pass that could not clear the record kept the last
    read's refusals, so once the ACL allowed LRANGE (a stand-in's) /ready named it refused for ever, and
    never the HDEL Redis refused. A command answered is taken back, the record's own refusal said."""
    sweep = reaping.sweep

    def sweep_sending_its_own_command(store, *args):
        store.r.lrange(key("sweep-only"), 0, 0)
        return sweep(store, *args)

    monkeypatch.setattr(reaping, "sweep", sweep_sending_its_own_command)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange", "-hdel"], **GRANTS)
        assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
        client.acl_setuser("dz", commands=["+@all", "-hdel"], **GRANTS)
        assert wait_until(lambda: "'lrange'" not in _reason(gateway), 15), _reason(gateway)
        assert "'hdel'" in _reason(gateway), _reason(gateway)


def test_a_refusal_of_one_gateways_user_is_not_said_by_a_gateway_running_as_another(demo_dir, tmp_path, monkeypatch):
    """Two gateways on one Redis as two users, the ACL refusing one of them LRANGE, which only its passes
    send (a stand-in's: a step sends some commands only for some data, a re-run's only with requests
    under way): the record was one for every gateway, so the other, whose user may run it and whose
    passes sent none, said the first's refusal, and answered its new requests 503. Each user's
    refusals are its own record now."""
    sweep = reaping.sweep

    def sweep_sending_lrange_as_dz(store, *args):
        if store.r.connection_pool.connection_kwargs["username"] == "dz":
            store.r.lrange(key("sweep-only"), 0, 0)
        return sweep(store, *args)

    monkeypatch.setattr(reaping, "sweep", sweep_sending_lrange_as_dz)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client):
        client.acl_setuser("dz2", commands=["+@all"], **GRANTS)
        with _gateway(port, demo_dir) as refused, _gateway(port, demo_dir, "dz2") as allowed:
            client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
            assert wait_until(lambda: "'lrange'" in _reason(refused), 15), _reason(refused)
            reasons, until = [], time.monotonic() + 3.0  # (15 passes of each)
            while time.monotonic() < until:
                reasons.append((_reason(refused), _reason(allowed)))
    assert all("'lrange'" in said for said, _ in reasons), reasons
    assert not any("user a command" in said for _, said in reasons), reasons


LRANGE_IN_A_SCRIPT = "return redis.call('lrange', KEYS[1], 0, 0)"
# what the sweep stand-in sends -> the ACL rules that refuse it (Redis 6: a subcommand only as allowed)
SENT_AND_REFUSED = {
    "script load": (lambda r: r.script_load("return 1"), ["+@all", "-script", "+script|exists"]),
    "lrange in a script": (lambda r: r.register_script(LRANGE_IN_A_SCRIPT)([key("sweep-only")]), ["+@all", "-lrange"]),
    "multi": (lambda r: None, ["+@all", "-multi"]),  # (the transaction that stamps the gateway, each pass)
    "zadd": (lambda r: None, ["+@all", "-zadd"]),  # (the gateway's stamp alone sends it: after the pass's steps)
}


@pytest.mark.parametrize("sent", SENT_AND_REFUSED)
def test_a_subcommands_or_a_scripts_refusal_is_cleared_once_redis_answers_it(sent, demo_dir, tmp_path, monkeypatch):
    """A refusal of a subcommand (named 'script|load' by Redis 7, 'script' by Redis 6; answered as 'script
    load') or of a command a Lua script calls (named as called, or 'unnamed': Redis 6; answered as
    'evalsha'): its answer, the ACL lifted, never cleared it, only its lapse. The lapse put out of reach
    (1,000 periods), /ready is healthy again once Redis answers what was refused."""
    send, refusing = SENT_AND_REFUSED[sent]
    sweep = reaping.sweep

    def sweep_sending_its_own_command(store, *args):
        send(store.r)
        return sweep(store, *args)

    monkeypatch.setattr(reaping, "sweep", sweep_sending_its_own_command)
    monkeypatch.setattr(refused_commands, "HELD_PASSES", 1000)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=refusing, **GRANTS)
        assert wait_until(lambda: "user a command" in _reason(gateway), 15), _reason(gateway)
        assert wait_until(lambda: client.exists(key("refused", "dz")), 15)  # (recorded, not only this pass's)
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert wait_until(lambda: _reason(gateway).startswith("no live worker"), 15), _reason(gateway)


def test_a_refusal_met_under_the_sweeps_lock_is_said_steadily_while_another_gateway_holds_the_lock(
    demo_dir, tmp_path, monkeypatch
):
    """The ACL refusing the gateway LRANGE, which the sweep sends (a stand-in's) only under its lock, and
    another gateway (another user's: the test's client here) holding that lock: the gateway met the
    refusal only at the sweeps it won, and the record lapsed 5 periods on; its /ready flapped
    healthy/refused (two gateways as two users, 10 s of /ready: 84 of 173 and 39 of 170 healthy). A
    pass whose sweep another gateway took tells nothing of the refusal: held, till the sweep answers it."""
    monkeypatch.setattr(reaping, "sweep", sweep_sending_lrange_under_its_lock)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-lrange"], **GRANTS)
        assert wait_until(lambda: "'lrange'" in _reason(gateway), 15), _reason(gateway)
        client.set(key("reaper"), "another gateway", px=60_000)
        reasons = _reasons_for(gateway, 3.0)  # (15 periods)
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        client.delete(key("reaper"))
        assert wait_until(lambda: _reason(gateway).startswith("no live worker"), 15), _reason(gateway)
    assert all("'lrange'" in said for said in reasons), [said[:40] for said in reasons]


def test_a_refusal_met_counting_again_after_a_failed_pass_is_cleared_once_redis_answers_it(
    demo_dir, tmp_path, monkeypatch
):
    """TIME refused (the stamps' read: every pass fails), then HKEYS, which only the no-worker counts' begin
    again after a failed pass sends (count_again's script): its commands went unrecorded, so its refusal
    ('unnamed': Redis 6's words in a script) was never seen answered once the ACL allowed it (the lapse
    put at 1,000 periods: for ever)."""
    monkeypatch.setattr(refused_commands, "HELD_PASSES", 1000)
    port = free_port()
    with _redis(port, tmp_path / "redis.log", ["+@all"]) as (_, client), _gateway(port, demo_dir) as gateway:
        client.acl_setuser("dz", commands=["+@all", "-time", "-hkeys"], **GRANTS)
        assert wait_until(lambda: client.hlen(key("refused", "dz")) == 2, 15), client.hgetall(key("refused", "dz"))
        client.acl_setuser("dz", commands=["+@all"], **GRANTS)
        assert wait_until(lambda: _reason(gateway).startswith("no live worker"), 15), _reason(gateway)
