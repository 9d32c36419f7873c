"""A Redis that refuses dayzero for good, a wrong password or a user's ACL without a command it
sends, ends ``dayzero up`` and a gateway started alone (compose's way) at once, in one line that
shows no password; no wait mends it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import redis

from dayzero import cli
from dayzero.procs import free_port, scratch_redis
from dayzero.redis_clients import async_client
from dayzero.settings import REDIS_ANSWER_WITHIN_S

REFUSALS = [
    (":wrong@", ":***@", "password refused"),
    ("", "", "it asks for a password, and the URL gives none"),
    # its ACL refuses PING: "did not answer within 10 s" (NOPERM names the command)
    (
        "noping:wrong@",
        "noping:***@",
        "its user 'noping' is refused a command dayzero sends (this user has no permissions to run the 'ping' command",
    ),
]

pytestmark = pytest.mark.usefixtures("roomy_host")  # (up's pool room check: not this machine's)


def _guarded(port: int) -> None:
    """A password for the default user, and a user ``noping`` whose password is "wrong", without PING."""
    server = redis.Redis(port=port)
    every_command_but_ping = ["+@all", "-ping"]
    server.acl_setuser(
        "noping", enabled=True, passwords=["+wrong"], keys=["*"], channels=["*"], commands=every_command_but_ping
    )
    server.config_set("requirepass", "right")


@pytest.mark.parametrize(("userinfo", "shown", "says"), REFUSALS)
def test_up_fails_at_once_on_a_redis_that_refuses_it(
    userinfo, shown, says, tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    """An AuthenticationError (a ConnectionError to redis-py) was retried as an unreachable Redis for
    the full REDIS_ANSWER_WITHIN_S, then "did not answer"; no wait mends a wrong password. A URL
    without a password was "password refused" too (redis-py's "HELLO must be called with the client
    already authenticated ...")."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    logs = tmp_path / "logs"
    with scratch_redis(tmp_path) as port:
        _guarded(port)
        monkeypatch.setenv("DAYZERO_REDIS_URL", f"redis://{userinfo}127.0.0.1:{port}/0")
        began = time.monotonic()
        argv = ["up", "--checkpoint", str(tiny_checkpoint), "--log-dir", str(logs), "--port", str(free_port())]
        assert cli.main(argv) == 1
        waited_s = time.monotonic() - began
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the Redis at redis://{shown}127.0.0.1:{port}/0 (DAYZERO_REDIS_URL or REDIS_URL): ")
    assert says in err and len(err.splitlines()) == 1 and "wrong" not in err, err
    assert waited_s < REDIS_ANSWER_WITHIN_S  # (it did not wait out the unreachable Redis's bound)
    assert not (logs / "gateway.log").exists()  # nothing was started


@pytest.mark.parametrize(("userinfo", "shown", "says"), REFUSALS)
def test_a_gateway_started_alone_ends_at_once_on_a_redis_that_refuses_it(
    userinfo, shown, says, tiny_checkpoint, tmp_path
):
    """``dayzero serve gateway`` with a wrong password started, and answered /ready with 503 for ever."""
    env = {**os.environ, "DAYZERO_CHECKPOINT": str(tiny_checkpoint), "DAYZERO_PORT": str(free_port())}
    argv = [sys.executable, "-m", "dayzero.cli", "serve", "gateway"]
    with scratch_redis(tmp_path) as port:
        _guarded(port)
        env["DAYZERO_REDIS_URL"] = f"redis://{userinfo}127.0.0.1:{port}/0"
        try:  # (on the bound: killed by subprocess.run)
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        except subprocess.TimeoutExpired as served:
            pytest.fail(f"the gateway served: {served.stderr!r}")
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err.startswith(f"error: the Redis at redis://{shown}127.0.0.1:{port}/0 (DAYZERO_REDIS_URL): ")
    assert says in err and len(err.splitlines()) == 1 and "wrong" not in err, err


async def _readiness_of(url: str) -> tuple[dict, int]:
    from services.gateway.readiness import readiness

    gw = SimpleNamespace(
        settings=SimpleNamespace(redis_url=url), bus=SimpleNamespace(r=async_client(url)), command_refused=None
    )
    try:
        return await readiness(gw)
    finally:
        await gw.bus.r.aclose()


def test_ready_says_a_command_its_user_is_refused_no_unreachable_redis(tmp_path):
    """A Redis whose ACL takes SET from the gateway's user (NOPERM): /ready's reason said "redis
    unreachable", which sends one looking for an outage."""
    with scratch_redis(tmp_path) as port:
        server = redis.Redis(port=port)
        every_command_but_set = ["+@all", "-set"]
        server.acl_setuser(
            "noset", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=every_command_but_set
        )
        url = f"redis://noset:pw@127.0.0.1:{port}/0"
        body, status = asyncio.run(_readiness_of(url))
    assert status == 503 and body["reason"].startswith("redis refuses DAYZERO_REDIS_URL's user a command: "), body
    assert "no permissions to run the 'set' command" in body["reason"], body
