"""A client's leave whose cancel Redis refused (at its memory limit): the cancel goes to Redis due
``DAYZERO_REFUSED_CANCEL_AFTER_S`` (7 s) later when a resume on another gateway may be retrying its
own refused watch, at once when nobody can resume the request or no other gateway shares the Redis
(services/gateway/leaving.py, dayzero.serving.gateways), against a real Redis."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from dayzero.procs import free_port
from dayzero.serving import gateways
from dayzero.serving.keys import key
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from dayzero.stack import Stack
from services.gateway import leaving
from services.gateway.bus import Bus

from .conftest import MODEL, SETTINGS_ENV, wait_until


def _running(redis_url: str, *buses: Bus) -> None:
    """The gateways of ``buses`` run on the Redis: each stamped as its reaper's pass does."""
    for bus in buses:
        gateways.stamp(redis.Redis.from_url(redis_url), bus.gateway, time.time(), time.time(), 60.0)


async def _logged(caplog, line: str) -> None:
    """Until the gateway's log has ``line`` (a step Redis refused: its first try is over)."""
    while not any(line in record.getMessage() for record in caplog.records):
        await asyncio.sleep(0.02)


def test_a_cancel_redis_refused_waits_for_a_resume_elsewhere_whose_watch_it_refused_too(redis_url, monkeypatch, caplog):
    """Redis refuses writes (at its memory limit): a client left its stream on one gateway (its grace
    over) and resumed it on another, whose watch Redis refused too (tried again every RETRY_S[1] at
    most). Once Redis took writes, the first gateway's retried leave landed before the watch's next
    try and cancelled the request under its reader; now that cancel goes to Redis, due 7 s
    on, and the watch takes it back."""
    monkeypatch.setattr(leaving, "RETRY_S", (3.0, 3.0))  # the tries: 3 s apart

    async def run() -> tuple[bool, float | None, bool]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=0.2)
        first, other = Bus(settings, make_celery(settings)), Bus(settings, make_celery(settings))
        client, readers = aioredis.Redis.from_url(redis_url), key("watchers", "r6")
        _running(redis_url, first, other)
        first.leaving.reading("r6")
        await first.watching.watch("r6", "first")
        await client.config_set("maxmemory", 1)
        try:
            first.leaving.leave("r6", "first", time.time(), finished=False)
            await asyncio.wait_for(_logged(caplog, "request r6: its cancel failed"), 10)  # (the unwatch went through)
            other.leaving.reading("r6")
            await other.leaving.watch("r6", "resumed", time.time())  # refused: tried again in 3 s, after the cancel
            await asyncio.wait_for(_logged(caplog, "request r6: its watch failed"), 10)
        finally:
            await client.config_set("maxmemory", 0)
        for _ in range(100):  # the watch's next try
            if await client.sismember(readers, "resumed"):
                break
            await asyncio.sleep(0.1)
        watched, cancelled = await client.sismember(readers, "resumed"), bool(await client.exists(key("cancel", "r6")))
        due = await client.zscore(key("left"), "r6")
        await client.aclose()
        for bus in (first, other):
            await asyncio.wait_for(bus.close(), 5)
        return watched, due, cancelled

    with caplog.at_level("WARNING", "dayzero.gateway"):
        assert asyncio.run(run()) == (True, None, False)  # (the entry it left was taken back by the watch)


@pytest.mark.parametrize(
    ("resumable", "others", "grace_s"),
    [(False, True, 60.0), (True, False, 0.2), (True, None, 0.2)],
    ids=[
        "one body: nobody can resume it",
        "a stream on the only gateway",
        "a stream on the only gateway, another one stopped",
    ],
)
def test_a_cancel_redis_refused_that_nobody_else_can_resume_goes_at_once(
    redis_url, monkeypatch, caplog, resumable, others, grace_s
):
    """A client left while Redis refused writes and nobody on another gateway can resume its request:
    answered in one body (its id comes only with the body), or a stream on the only gateway running
    on its Redis (a resume here holds or supersedes the cancel; ``others`` None: another one ran and
    stopped). Its cancel goes as soon as Redis takes it (was: left to Redis 7 s on, 7 s more
    decoding for a client gone, plus a reaper's period; a lone gateway on a Redis of the user's, not
    ``dayzero up``'s own, still was)."""
    monkeypatch.setattr(leaving, "RETRY_S", (0.5, 0.5))

    async def run() -> tuple[bool, float | None]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=grace_s)
        bus, client = Bus(settings, make_celery(settings)), aioredis.Redis.from_url(redis_url)
        cancel, left = key("cancel", "r7"), key("left")
        await client.delete(key("gateways"))  # (the module's other tests' gateways)
        other = Bus(settings, make_celery(settings))
        _running(redis_url, bus, *([other] if others is not False else []))
        if others is None:
            await other.close()
        bus.leaving.reading("r7")
        await bus.watching.watch("r7", "read")
        await client.config_set("maxmemory", 1)
        try:
            bus.leaving.leave("r7", "read", time.time(), finished=False, resumable=resumable)
            await asyncio.wait_for(_logged(caplog, "request r7: its cancel failed"), 10)
        finally:
            await client.config_set("maxmemory", 0)
        await asyncio.wait_for(_logged(caplog, "request r7: its cancel went through"), 10)
        cancelled, due = bool(await client.exists(cancel)), await client.zscore(left, "r7")
        await client.aclose()
        for gone in [bus] + ([other] if others is not None else []):
            await asyncio.wait_for(gone.close(), 5)
        return cancelled, due

    with caplog.at_level("WARNING", "dayzero.gateway"):
        assert asyncio.run(run()) == (True, None)


def test_up_on_a_redis_of_the_user_s_cancels_a_refused_stream_at_once_while_its_gateway_is_alone(
    text_dir, redis_url, tmp_path
):
    """``dayzero up`` on a Redis of the user's (not its embedded one): its one gateway's refused stream
    cancel was left to Redis 7 s on, for a resume on another gateway there was none of (360 tokens
    decoded for nobody against 54 under the embedded Redis: bench/refused_stream_cancel.py). It runs
    alone there (its reaper's stamps say so): the cancel goes once Redis takes writes. Real processes:
    the gateway (no worker: its request waits, unread), a Redis of the test's."""
    r = redis.Redis.from_url(redis_url)
    r.delete(key("gateways"))  # (the module's other tests' gateways)
    env = {**SETTINGS_ENV, "DAYZERO_CHECKPOINT": str(text_dir), "DAYZERO_NO_WORKER_TIMEOUT_S": "600"}
    stack = Stack({"vision": 0, "prefill": 0, "decode": 0}, free_port(), tmp_path, env, redis_url=redis_url)
    stack.start()
    try:
        assert wait_until(lambda: r.zcard(key("gateways")) == 1, 60)  # (up: its reaper stamped it)
        body = {"model": MODEL, "prompt": [0, 5, 6], "max_tokens": 50, "stream": True}
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=30) as response:
            assert response.status_code == 200, response.read()
            rid = response.headers["x-request-id"]
            assert wait_until(lambda: r.exists(key("watchers", rid)), 10)
            r.config_set("maxmemory", 1)
        try:
            time.sleep(1.0)  # the client left, its unwatch refused
        finally:
            r.config_set("maxmemory", 0)
        assert wait_until(lambda: r.exists(key("cancel", rid)), 5)  # (was: left to Redis, due 7 s on)
        assert r.zscore(key("left"), rid) is None
    finally:
        r.config_set("maxmemory", 0)
        stack.stop()
    assert r.zcard(key("gateways")) == 0  # (it stopped: it runs no more)


def test_a_refused_cancel_waits_for_a_resume_here_whose_watch_redis_refused_too(redis_url, monkeypatch, caplog):
    """The same race on one gateway: a client left while Redis refused every write (a refusal that
    takes the unwatch too: no replica for min-replicas-to-write; READONLY, MISCONF) and resumed on
    the same gateway within the grace, its watch refused too. Once Redis took writes the leave's
    unwatch went through first (nobody read the request in Redis), and with no 7 s left to Redis
    (0: the only gateway) its cancel landed before the watch's next try, under the resumed reader. A
    read here whose watch is still tried again now holds the cancel; its own leave decides."""
    monkeypatch.setattr(leaving, "RETRY_S", (3.0, 3.0))  # the tries: 3 s apart

    async def run() -> tuple[bool, bool]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=0.2, refused_cancel_after_s=0)
        bus, client, readers = (
            Bus(settings, make_celery(settings)),
            aioredis.Redis.from_url(redis_url),
            key("watchers", "r9"),
        )
        bus.leaving.reading("r9")
        await bus.watching.watch("r9", "first")
        await client.config_set("min-replicas-to-write", 1)  # NOREPLICAS: every write refused, reads answer
        try:
            bus.leaving.leave("r9", "first", time.time(), finished=False)
            await asyncio.wait_for(_logged(caplog, "request r9: its unwatch failed"), 10)
            await asyncio.sleep(1.0)  # the resume's watch is tried again ~1 s after the unwatch
            bus.leaving.reading("r9")
            await bus.leaving.watch("r9", "resumed", time.time())
            await asyncio.wait_for(_logged(caplog, "request r9: its watch failed"), 10)
        finally:
            await client.config_set("min-replicas-to-write", 0)
        for _ in range(100):  # the watch's next try, after the unwatch's and the grace
            if await client.sismember(readers, "resumed"):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        watched, cancelled = await client.sismember(readers, "resumed"), bool(await client.exists(key("cancel", "r9")))
        await client.aclose()
        await asyncio.wait_for(bus.close(), 5)
        return bool(watched), cancelled

    with caplog.at_level("WARNING", "dayzero.gateway"):
        assert asyncio.run(run()) == (True, False)
