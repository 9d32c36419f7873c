"""A gateway whose Redis starts refusing its password while it serves (a password changed, a Redis
restarted with another): it answered 503 for ever and never exited, while its workers exit 3 past
DAYZERO_CREDENTIALS_REFUSED_S for their supervisor to start them again with their current settings.
Now it says so and exits 3 the same way, its spans still batched for export flushed first (os._exit
dropped them). Real processes: Redis and a gateway."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from dayzero.procs import free_port, scratch_redis, spawn, terminate

from .conftest import MODEL, SETTINGS_ENV, wait_until
from .otlp import otlp_collector

REFUSED_S = 2.0  # DAYZERO_CREDENTIALS_REFUSED_S here


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def test_a_gateway_whose_password_redis_refuses_midrun_says_so_and_exits_3(tiny_checkpoint, tmp_path):
    port, log = free_port(), tmp_path / "gateway.log"
    with scratch_redis(tmp_path) as redis_port, otlp_collector() as (collector, spans):
        server = redis.Redis(port=redis_port)
        server.config_set("requirepass", "right")
        server = redis.Redis(port=redis_port, password="right")
        env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(tiny_checkpoint), "DAYZERO_PORT": str(port)}
        env |= {"DAYZERO_REDIS_URL": f"redis://:right@127.0.0.1:{redis_port}/0"}
        env |= {"DAYZERO_CREDENTIALS_REFUSED_S": str(REFUSED_S)}
        env |= {"DAYZERO_TRACE_EXPORTER": "otlp-http", "DAYZERO_TRACE_ENDPOINT": f"{collector}/v1/traces"}
        env |= {"OTEL_BSP_SCHEDULE_DELAY": "600000"}  # no timed export: only a flush sends the batch
        gateway = spawn([sys.executable, "-m", "dayzero.cli", "serve", "gateway"], log, env)
        try:
            assert wait_until(lambda: _answers(f"http://127.0.0.1:{port}/ready"), 120), log.read_text()[-3000:]
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
            server.config_set("requirepass", "changed")  # (Redis keeps the connections that logged in: cut them)
            server.client_kill_filter(_type="normal", skipme=True)
            assert wait_until(lambda: gateway.poll() is not None, 30), (
                "the gateway served on: " + log.read_text()[-2000:]
            )
        finally:
            terminate([gateway], 10)
    text = log.read_text(errors="replace")
    assert gateway.returncode == 3, text[-3000:]
    said = re.search(r"Redis has refused this gateway's credentials for (\d+) s \((.*)\): exiting 3", text)
    assert said and int(said[1]) >= REFUSED_S and "invalid username-password pair" in said[2], text[-3000:]
    assert "right" not in said[0]
    assert "GET /v1/models" in spans  # (batched when the gateway exited)


def _ready_reason(url: str) -> str:
    try:
        return httpx.get(url, timeout=2).json().get("reason", "")
    except (httpx.HTTPError, ValueError):
        return ""


@pytest.mark.parametrize("command", ["smembers", "multi"])  # (the sweep's; every transaction's first)
def test_a_gateway_whose_user_is_refused_a_command_midrun_serves_on_and_says_so_once(
    tiny_checkpoint, tmp_path, command
):
    """An ACL that takes a command of the reaper's passes from the gateway's user (NOPERM): it exited 3
    past DAYZERO_CREDENTIALS_REFUSED_S and was started again every 30 s, its open streams ended each
    time, and met the same ACL again. Now it serves on: one line in its log, /ready's reason while it
    lasts, one line once the ACL allows the command again. A new request meanwhile is answered 503 at
    once (its message names no user, ACL or setting: /ready's reason did, to every client): admitted,
    no pass would end it past DAYZERO_NO_WORKER_TIMEOUT_S (nor the task time limit), and one no worker
    took waited for ever (past the client's 15 s here). MULTI refused alone: Redis runs the transaction's
    commands one by one and answers its EXEC "EXEC without MULTI", which was not taken for a refusal
    (/ready said "redis unreachable", a new request was admitted and waited for ever)."""
    env = {"DAYZERO_CREDENTIALS_REFUSED_S": str(REFUSED_S), "DAYZERO_NO_WORKER_TIMEOUT_S": "1"}
    with gateway_of_an_acl_user(tiny_checkpoint, tmp_path, env) as (server, grants, gateway, ready, log):
        assert wait_until(lambda: _answers(ready), 120), log.read_text()[-3000:]
        server.acl_setuser("dz", commands=["+@all", f"-{command}"], **grants)
        assert wait_until(lambda: "user a command" in _ready_reason(ready), 30), _ready_reason(ready)
        assert f"'{command}'" in _ready_reason(ready) and "ACL GETUSER dz" in _ready_reason(ready)
        # (/ready's own reads meet a refused MULTI: its reason may come before the reaper's pass, which admission reads)
        assert wait_until(lambda: "is refused a command dayzero sends" in log.read_text(), 30), log.read_text()[-3000:]
        _assert_refused_at_once(ready.removesuffix("/ready"))
        assert not wait_until(lambda: gateway.poll() is not None, 3 * REFUSED_S), log.read_text()[-3000:]
        server.acl_setuser("dz", commands=["+@all"], **grants)
        assert wait_until(lambda: "user a command" not in _ready_reason(ready), 30), log.read_text()[-3000:]
    text = log.read_text(errors="replace")
    assert text.count("is refused a command dayzero sends") == 1, text[-3000:]
    assert text.count("takes the gateway's commands again") == 1, text[-3000:]
    assert "Redis has refused this gateway's credentials" not in text, text[-3000:]


@contextlib.contextmanager
def gateway_of_an_acl_user(
    checkpoint: Path, tmp_path: Path, env: dict[str, str]
) -> Iterator[tuple[redis.Redis, dict, subprocess.Popen, str, Path]]:
    """A gateway process (settings ``env`` more) whose Redis user ``dz`` an ACL grants every command,
    on a Redis of its own; -> that Redis (its default user), the user's grants, the gateway, its
    /ready's URL and its log. Stopped after."""
    port, log = free_port(), tmp_path / "gateway.log"
    with scratch_redis(tmp_path) as redis_port:
        server = redis.Redis(port=redis_port)
        grants = {"enabled": True, "passwords": ["+pw"], "keys": ["*"], "channels": ["*"]}
        server.acl_setuser("dz", commands=["+@all"], **grants)
        env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(checkpoint), "DAYZERO_PORT": str(port), **env}
        env |= {"DAYZERO_REDIS_URL": f"redis://dz:pw@127.0.0.1:{redis_port}/0"}
        gateway = spawn([sys.executable, "-m", "dayzero.cli", "serve", "gateway"], log, env)
        try:
            yield server, grants, gateway, f"http://127.0.0.1:{port}/ready", log
        finally:
            terminate([gateway], 10)


def _assert_refused_at_once(url: str) -> None:
    body = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 4}
    try:
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=15)
    except httpx.ReadTimeout:
        raise AssertionError("admitted, it waited past 15 s for a worker (bound: 1 s)") from None
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
    error = answer.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "queue_unavailable", error
    assert error["message"] == "the request queue is unavailable on this gateway; retry on another", error
