"""A worker that starts while Redis refuses writes (at its memory limit, no eviction), or while Redis
is down, waits for it and then serves. Celery's consumer declares its queue at its start in a
transaction, which Redis refuses then; Celery took that for an unrecoverable error and the process
exited, its weights loaded for nothing, and ``dayzero up`` started it again (the soak's A5). Real
processes: Redis, a gateway, a prefill worker restarted during the refusal, a decode worker."""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import sys

import httpx
import pytest
import redis

from dayzero.parallel.launch import launch_from
from dayzero.procs import free_port, scratch_redis, spawn, start_redis, terminate
from dayzero.serving.worker import exit_on_failure

from .conftest import MODEL, SETTINGS_ENV, start_stack, wait_until
from .test_decode_appends import writes_refused

BODY = {"model": MODEL, "prompt": [0, 5, 6, 7], "max_tokens": 4, "temperature": 0}


def test_a_worker_started_while_redis_refuses_writes_waits_and_then_serves(text_dir, tmp_path):
    stack = start_stack(text_dir, tmp_path, {"vision": 0, "prefill": 1, "decode": 1})
    r = redis.Redis.from_url(stack.redis_url)
    prefill, log = stack.child("prefill0"), tmp_path / "prefill0.log"
    try:
        with writes_refused(r):
            os.killpg(prefill.proc.pid, signal.SIGKILL)
            prefill.proc.wait(10)
            assert stack.supervise() == ["prefill0"]
            started = prefill.proc
            waits = "prefill waits to consume: Redis refuses writes"
            # loaded, at its consumer's start: it waits (was: Celery's "Unrecoverable error", the process ended)
            assert wait_until(lambda: started.poll() is not None or waits in log.read_text(errors="replace"), 120)
            assert not wait_until(lambda: started.poll() is not None, 2), log.read_text(errors="replace")[-3000:]
        stack.until_ready("prefill0", 60)
        stack.wait_ready(timeout_s=60)
        assert started.poll() is None and prefill.restarts == 1  # the same process serves: nothing restarted it
        answer = httpx.post(f"{stack.url}/v1/completions", json=BODY, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == BODY["max_tokens"]
        assert "Redis takes writes again" in log.read_text(errors="replace")
    finally:
        stack.stop()


def test_a_worker_started_while_redis_is_down_waits_for_it_and_then_serves(text_dir, tmp_path):
    """Redis is down (stopped, restarting) when a worker has loaded: it waits, and serves once Redis is
    back (was: it exited at its warm-up's script load, and ``dayzero up`` loaded its weights again and
    again: 6 starts in a 39 s Redis outage of the two-gateway soak)."""
    port, log = free_port(), tmp_path / "prefill0.log"
    env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(text_dir)}
    env["DAYZERO_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    worker = spawn([sys.executable, "-m", "dayzero.cli", "serve", "prefill", "--name", "prefill0"], log, env)

    def ended_or_logged(line: str) -> bool:
        return worker.poll() is not None or line in log.read_text(errors="replace")

    try:
        assert wait_until(lambda: ended_or_logged("waits for Redis"), 180)
        assert not wait_until(lambda: worker.poll() is not None, 2), log.read_text(errors="replace")[-3000:]
        server = start_redis(port, tmp_path / "redis.log")
        try:
            assert wait_until(lambda: ended_or_logged(" ready."), 120)
            assert worker.poll() is None and "reached Redis after" in log.read_text(errors="replace")
        finally:
            terminate([worker], 10)
            server.terminate()
            server.wait()
    finally:
        terminate([worker], 10)


def _ping_taken_away(r: redis.Redis) -> None:
    r.acl_setuser("worker", enabled=True, passwords=["+wrong"], keys=["*"], channels=["*"], commands=["+@all", "-ping"])


@pytest.mark.parametrize(
    ("guard", "userinfo", "said"),
    [
        (lambda r: r.config_set("requirepass", "right"), ":wrong", "invalid username-password pair"),
        (_ping_taken_away, "worker:wrong", "no permissions to run the 'ping' command"),  # (was: loaded first)
    ],
)
def test_a_worker_whose_redis_refuses_it_ends_its_start_before_loading_its_weights(
    guard, userinfo, said, text_dir, tmp_path
):
    """Redis refuses the URL's password: the start fails, saying so (was: it waited for Redis forever,
    "waits for Redis (invalid username-password pair ...)", and ``dayzero alive`` counted it alive:
    a Redis it cannot read is not counted against a worker), before its weights load (they loaded for
    nothing: under ``dayzero up`` again at each restart, a worker whose credentials Redis refused for
    DAYZERO_CREDENTIALS_REFUSED_S exiting 3 to be started again with the same URL)."""
    log, checkpoint = tmp_path / "prefill0.log", tmp_path / "checkpoint"
    shutil.copytree(text_dir, checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"no weights")  # (a load would fail on them, and say so)
    with scratch_redis(tmp_path) as port:
        guard(redis.Redis(port=port))
        env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(checkpoint)}
        env["DAYZERO_REDIS_URL"] = f"redis://{userinfo}@127.0.0.1:{port}/0"
        worker = spawn([sys.executable, "-m", "dayzero.cli", "serve", "prefill", "--name", "prefill0"], log, env)
        try:
            assert wait_until(
                lambda: worker.poll() is not None or "waits for Redis" in log.read_text("utf-8", "replace"), 180
            )
            assert worker.poll() is not None, log.read_text(errors="replace")[-3000:]
            text = log.read_text(errors="replace")
            line = f"the prefill worker cannot start: the Redis at redis://{userinfo.partition(':')[0]}:***@"
            assert line in text and said in text.partition(line)[2].splitlines()[0], text[-3000:]
            assert "Traceback" not in text, text[-3000:]  # (the line alone: its traceback followed it)
            # (refused after loading, its weights' own failure came first: "loading weights" was never logged)
        finally:
            terminate([worker], 10)


def test_a_worker_given_the_sdks_endpoint_without_a_scheme_ends_its_start_in_one_line(text_dir, tmp_path):
    """71476d9 refused OTEL_EXPORTER_OTLP_ENDPOINT=host:4318 (otlp-http dropped every span) where the
    tracer is set up: a gateway's start said it in one line, a worker's in a traceback from Celery's
    worker_init, exiting 3 (a refusal its supervisor starts it again for: compose's crash loop)."""
    with scratch_redis(tmp_path) as port:
        env = {**os.environ, **SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_TRACE_EXPORTER": "otlp-http"}
        env |= {"DAYZERO_REDIS_URL": f"redis://127.0.0.1:{port}/0", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}
        env.pop("DAYZERO_TRACE_ENDPOINT", None)
        argv = [sys.executable, "-m", "dayzero.cli", "serve", "prefill", "--name", "prefill0"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith("error: OTEL_EXPORTER_OTLP_ENDPOINT='collector:4318' is no URL"), err


class _Exited(Exception):
    pass


def _exit(code: int):
    raise _Exited(code)


def _refused():
    launch_from({"RANK": "0"}, "cpu")  # dayzero's own refusal (a ValueError): what to set


def _failed():
    raise RuntimeError("the attention pools' 4.0 MiB do not fit")


def _library_failed():
    ipaddress.ip_address("redis-host")  # a bug under the start: the standard library's ValueError


@pytest.mark.parametrize(("fail", "traceback"), [(_refused, False), (_failed, True), (_library_failed, True)])
def test_a_start_refused_is_one_line_and_an_unexpected_failure_keeps_its_traceback(
    fail, traceback, caplog, monkeypatch
):
    """A worker refusing its pools (DAYZERO_KV_BUDGET_MB past what the device holds: a one-line ValueError)
    logged 'the prefill worker cannot start' under a traceback ending in that line: the 15 lines of its
    log ``up`` shows held the traceback. A refusal is its line alone; an error nobody foresaw keeps its
    traceback, where the bug is, a library's ValueError too (it was one line naming no file: "'redis-host'
    does not appear to be an IPv4 or IPv6 address")."""
    monkeypatch.setattr(os, "_exit", _exit)
    monkeypatch.setattr(logging, "shutdown", lambda: None)  # (the test's own handlers stay open)
    with pytest.raises(Exception) as raised:
        fail()
    receiver = exit_on_failure(fail, "prefill", "")
    with caplog.at_level(logging.ERROR, logger="dayzero.worker"), pytest.raises(_Exited) as exited:
        receiver()
    assert exited.value.args == (3,)  # (REFUSED_EXIT: up restarts it, compose too)
    [record] = caplog.records
    said = "the prefill worker cannot start"
    assert record.getMessage() == (said if traceback else f"{said}: {raised.value}")
    assert (record.exc_info is not None) == traceback
