"""A command the gateway's Redis user is refused, met where redis-py raises no NoPermissionError: in a
Lua script of the reaper's (Redis 6: "The user executing the script can't run this command"), or in
a transaction (ExecAbortError: "Transaction discarded because of: NOPERM ..."), or its MULTI alone
(Redis runs the commands one by one and answers EXEC "EXEC without MULTI"). The reaper's passes
failed on it without a line, /ready said "redis unreachable" (or named no refusal) and a request no
worker took waited for ever. Real Redis, its ACL."""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from dayzero.procs import free_port, scratch_redis, start_redis
from dayzero.redis_refusals import command_refused, refused_command, refused_for_good, told
from dayzero.serving.intake import run_loop
from dayzero.serving.lifecycle import Lifecycle
from dayzero.serving.scripts import Take

from .services.lifecycle_requests import request

GRANTS = {"enabled": True, "passwords": ["+pw"], "keys": ["*"], "channels": ["*"]}


def _transaction(r: redis.Redis) -> None:
    r.pipeline(transaction=True).set("x", 1).get("x").execute()


SENT = {
    "get": lambda r: r.eval("return redis.call('get', KEYS[1])", 1, "x"),  # (the reaper's scripts read so)
    "exec": _transaction,
    "multi": _transaction,  # (its MULTI alone: "EXEC without MULTI")
    "smembers": lambda r: r.smembers("x"),  # (NoPermissionError: taken before too)
}


@pytest.mark.parametrize("command", SENT)
def test_a_command_refused_in_a_script_or_a_transaction_is_said_as_refused(command, tmp_path):
    with scratch_redis(tmp_path) as port:
        redis.Redis(port=port).acl_setuser("dz", commands=["+@all", f"-{command}"], **GRANTS)
        url = f"redis://dz:pw@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        with pytest.raises(redis.RedisError) as refused:
            SENT[command](client)
        client.close()
    assert command_refused(refused.value), refused.value
    said = refused_for_good(url, refused.value)
    assert "its user 'dz' is refused a command dayzero sends" in said and "ACL GETUSER dz" in said
    assert command == "get" or f"'{command}'" in said  # (the one to grant; Redis 6's script error names none)
    assert refused_command(refused.value) in (command, "unnamed")  # (the refusals' record's name)
    assert not command_refused(redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'"))


def test_a_worker_loop_refused_multi_says_the_refusal_not_an_outage(tmp_path, caplog):
    """A worker whose user an ACL refuses MULTI alone: its loop's transaction (a prefill worker's
    handoff releases here) failed on "EXEC without MULTI", logged as "redis unavailable (EXEC without
    MULTI); retrying", an outage that never ends, naming no refusal. The line names 'multi' and the ACL
    (a transaction of its own: the handoff release sends none now, the next test)."""
    with scratch_redis(tmp_path) as port:
        redis.Redis(port=port).acl_setuser("dz", commands=["+@all", "-multi"], **GRANTS)
        client = redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0")
        stop = threading.Event()

        def iteration() -> None:
            stop.set()  # (one pass: the loop ends after this one's failure)
            _transaction(client)

        caplog.set_level(logging.WARNING, "dayzero.test")
        run_loop(stop, iteration, logging.getLogger("dayzero.test"), lambda: None)
        client.close()
    (line,) = [record.getMessage() for record in caplog.records]
    assert line.startswith("redis unavailable (Redis refuses the user a command ('multi'"), line
    assert "ACL GETUSER" in line, line


def test_a_prefill_worker_refused_multi_still_frees_the_blocks_decode_took(tmp_path):
    """A prefill worker whose user an ACL refuses MULTI alone: its release of the handoffs decode took
    read and deleted its inbox in a transaction; the read and the delete ran one by one, EXEC failed
    "EXEC without MULTI" and the reply was lost, the notices with it: the blocks stayed kept till each
    request ended, not freed once decode had copied them. Each notice is read now."""
    with scratch_redis(tmp_path) as port:
        redis.Redis(port=port).acl_setuser("dz", commands=["+@all", "-multi"], **GRANTS)
        store = Lifecycle(redis.Redis.from_url(f"redis://dz:pw@127.0.0.1:{port}/0"))
        for rid in ("taken", "waits"):
            store.admit(request(rid), [], "", 60)
        assert store.take_handoffs([("taken", 0, "prefill0")], "decode0", 30) == {"taken": Take.CLAIMED}
        held = {"taken": 0, "waits": 0}
        assert store.released("prefill0", held) == {"taken"}
        assert store.released("prefill0", {"waits": 0}) == set()  # (read once)
        store.r.close()


def test_a_multi_renamed_away_is_said_with_the_config_beside_the_acl(tmp_path):
    """A server whose config disabled MULTI (rename-command MULTI ""): Redis answers a transaction's EXEC
    "EXEC without MULTI" as when an ACL refuses MULTI, and the line sent the reader to the ACL alone,
    which then allows everything. Both lines (a service's end and /ready's, a worker loop's) name both."""
    port = free_port()
    server = start_redis(port, tmp_path / "redis.log", "--rename-command", "MULTI", "")
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        with pytest.raises(redis.RedisError) as refused:
            _transaction(client)
        client.close()
    finally:
        server.terminate()
        server.wait()
    for said in (refused_for_good(url, refused.value), told(refused.value)):
        assert "'multi'" in said and "ACL GETUSER" in said and "rename-command" in said, said
