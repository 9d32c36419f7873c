"""A gateway whose host's clock is off Redis's (30 s ahead, 20 s behind): its admissions' stamps, the
time limit its reaper keeps, the cancels a stopped gateway leaves to the others (due at its grace's
end) and its first requests are on Redis's clock (redis_clock.py). Real gateways, each a process of
its own whose ``time.time`` is moved (as test_liveness_clock.py's workers), on a real Redis; no
worker (requests wait in their queue)."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from dayzero.procs import free_port, start_redis
from dayzero.serving import redis_clock
from dayzero.serving.keys import key
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from services.gateway import leaving
from services.gateway.bus import Bus

from .conftest import MODEL, SETTINGS_ENV, sse_events, wait_until
from .test_leaving_refused import _logged
from .test_liveness_clock import skewed_worker

GRACE_S = 2.0
LIMIT_S = 8  # the survivor's DAYZERO_TASK_TIME_LIMIT_S (past the left request's grace: its cancel comes first)
STREAM = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 50, "stream": True}


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def start_gateway(name: str, skew: float, redis_url: str, checkpoint: Path, log_dir: Path, **extra: str):
    """A real gateway whose process's clock is ``skew`` s off this host's (and Redis's), answering
    /health -> its process, its URL."""
    port = free_port()
    env = {
        **SETTINGS_ENV,
        "DAYZERO_CHECKPOINT": str(checkpoint),
        "DAYZERO_REDIS_URL": redis_url,
        "DAYZERO_PORT": str(port),
        "DAYZERO_DISCONNECT_GRACE_S": str(GRACE_S),
        "DAYZERO_NO_WORKER_TIMEOUT_S": "600",  # (no worker: requests wait, never end as unserved)
        **extra,
    }
    proc, url = skewed_worker("gateway", name, skew, log_dir / f"{name}.log", env), f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    assert wait_until(answers, 60) and proc.poll() is None, (log_dir / f"{name}.log").read_text()[-2000:]
    return proc, url


def stopped(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def admitted(url: str, client: redis.Redis) -> str:
    """A stream admitted on the gateway at ``url`` and left at once (its headers read) -> its id."""
    with httpx.stream("POST", f"{url}/v1/completions", json=STREAM, timeout=30) as response:
        assert response.status_code == 200, response.read()
        rid = response.headers["x-request-id"]
    assert wait_until(lambda: client.exists(key("req", rid)), 10)
    return rid


def read_to_its_end(url: str, client: redis.Redis) -> tuple[str, threading.Thread]:
    """A stream admitted on the gateway at ``url``, its client reading on until the stream ends (a
    thread): a request nobody takes waits out its time limit (one whose client left is ended by the
    reaper's next pass) -> its id, the reading thread."""
    ids: queue.Queue[str] = queue.Queue()

    def read() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=STREAM, timeout=60) as response:
            ids.put(response.headers["x-request-id"])
            for _ in response.iter_lines():
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rid = ids.get(timeout=30)
    assert wait_until(lambda: client.exists(key("req", rid)), 10)
    return rid, reader


def created(client: redis.Redis, rid: str) -> float:
    return json.loads(client.get(key("req", rid)))["created"]


def read_until_stopped(url: str, gateway, client: redis.Redis) -> str:
    """A stream read on the gateway at ``url`` until it stops (SIGTERM once the read is marked in
    Redis): it leaves the request's cancel to Redis, due at the grace's end -> the request's id."""
    with httpx.stream("POST", f"{url}/v1/completions", json=STREAM, timeout=60) as response:
        rid = response.headers["x-request-id"]
        assert wait_until(lambda: client.exists(key("watchers", rid)), 10)
        gateway.send_signal(signal.SIGTERM)
        events = [data for _, data in sse_events(response)]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down", events[-3:]
    assert wait_until(lambda: client.zscore(key("left"), rid) is not None, 10)
    gateway.wait(30)
    return rid


@pytest.mark.parametrize(("stopping", "survivor"), [(-20.0, 30.0), (30.0, -20.0)])
def test_a_skewed_gateway_cancels_what_a_stopped_one_left_and_ends_requests_by_redis_clock(
    text_dir, redis_url, tmp_path, stopping, survivor
):
    """A gateway stops while its client reads a stream (a rolling restart): the request's cancel is
    left to Redis, due at the grace's end, for whichever gateway runs. The survivor compared that due
    time with its own clock: 30 s ahead it cancelled at its next pass (the client that would resume
    on it found its request cancelled), 20 s behind 20 s late (a client gone, generating for
    nobody). Now it reads Redis's time: at the grace's end. Its own request ends at its time limit by
    Redis's clock, and both gateways stamp their admissions and the due time with Redis's."""
    client = redis.Redis.from_url(redis_url)
    limit = {"DAYZERO_TASK_TIME_LIMIT_S": str(LIMIT_S)}
    gateways = []
    try:
        gateways.append(start_gateway("gateway_s", stopping, redis_url, text_dir, tmp_path))
        gateways.append(start_gateway("gateway_t", survivor, redis_url, text_dir, tmp_path, **limit))
        (first, first_url), (_, other_url) = gateways
        waits, reader = read_to_its_end(other_url, client)  # (nobody takes it: it waits out its time limit)
        assert abs(created(client, waits) - redis_now(client)) < 1.0

        rid = read_until_stopped(first_url, first, client)
        due = client.zscore(key("left"), rid)  # (was: gone at the survivor's next pass, 30 s ahead)
        assert due is not None and GRACE_S < due - created(client, rid) < GRACE_S + 5  # (both on Redis's clock)
        assert wait_until(lambda: client.exists(key("cancel", rid)), GRACE_S + 8)  # (was: 20 s late)
        assert redis_now(client) >= due  # (was: at once)

        assert wait_until(lambda: client.get(key("done", waits)) is not None, LIMIT_S + 8)
        assert redis_now(client) >= created(client, waits) + LIMIT_S
        reader.join(30)
    finally:
        for proc, _ in gateways:
            stopped(proc)


def test_a_skewed_gateway_whose_redis_was_down_at_its_start_stamps_its_first_request_on_redis_clock(text_dir, tmp_path):
    """A gateway that started while Redis was down could not measure its offset to Redis's clock
    until its reaper's next pass: a request admitted before that was stamped with the host's clock,
    30 s ahead a request already 30 s old (ended at once by a 30 s time limit). Now the gateway
    measures before it takes a request."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    lease = {"DAYZERO_LEASE_S": "60"}  # (a reaper pass every 30 s: none measures within the test)
    gateway, gateway_url = start_gateway("gateway_r", 30.0, url, text_dir, tmp_path, **lease)
    server = None
    try:
        server = start_redis(port, tmp_path / "redis.log")
        client = redis.Redis.from_url(url)
        rid = admitted(gateway_url, client)
        assert abs(created(client, rid) - redis_now(client)) < 1.0  # (was: 30 s ahead)
    finally:
        stopped(gateway)
        if server is not None:
            server.terminate()
            server.wait(10)


def test_a_cancel_redis_refused_is_due_after_the_refusal_on_redis_clock(redis_url, monkeypatch, caplog):
    """A leave whose cancel Redis refused goes to Redis due ``DAYZERO_REFUSED_CANCEL_AFTER_S`` on, for a resume on
    another gateway (one runs beside it) retrying its own refused watch to take back. It was due by
    the host's clock: 20 s behind, 13 s past already, cancelled by any gateway's next pass under the
    resume on its way. The gateway's clock is moved in this process (as SKEWED_CLOCK moves a worker's)."""
    host_time = time.time
    monkeypatch.setattr(time, "time", lambda: host_time() - 20.0)
    monkeypatch.setattr(redis_clock, "_offset_s", None)
    monkeypatch.setattr(leaving, "RETRY_S", (0.5, 0.5))
    redis_clock.sync(redis.Redis.from_url(redis_url))

    settings = Settings(redis_url=redis_url, disconnect_grace_s=0.2)

    async def run() -> tuple[float | None, float]:
        bus, client = Bus(settings, make_celery(settings)), aioredis.Redis.from_url(redis_url)
        await client.zadd(key("gateways"), {"another gateway": redis_clock.now()})  # (its reaper's stamp)
        bus.leaving.reading("r20")
        await bus.watching.watch("r20", "first")
        await client.config_set("maxmemory", 1)
        try:
            bus.leaving.leave("r20", "first", redis_clock.now(), finished=False)
            await asyncio.wait_for(_logged(caplog, "request r20: its cancel failed"), 10)
        finally:
            await client.config_set("maxmemory", 0)
        for _ in range(100):  # the cancel's next try
            if await client.zscore(key("left"), "r20") is not None:
                break
            await asyncio.sleep(0.05)
        due, (seconds, micros) = await client.zscore(key("left"), "r20"), await client.time()
        await client.aclose()
        await asyncio.wait_for(bus.close(), 5)
        return due, seconds + micros / 1e6

    with caplog.at_level("WARNING", "dayzero.gateway"):
        due, now = asyncio.run(run())
    assert due is not None and due - now > settings.refused_cancel_after_s - 2  # (was: 13 s past)
