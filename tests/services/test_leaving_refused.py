"""A client's leave whose cancel Redis refused (at its memory limit): the cancel goes to Redis due
``DAYZERO_REFUSED_CANCEL_AFTER_S`` (7 s) later when a resume on another gateway may be retrying its
own refused watch, at once when nobody can resume the request (services/gateway/leaving.py), against
a real Redis."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from dayzero.serving.keys import key
from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from services.gateway import leaving
from services.gateway.bus import Bus


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


def test_a_cancel_redis_refused_of_a_request_nobody_can_resume_goes_at_once(redis_url, monkeypatch, caplog):
    """A request answered in one body whose client left while Redis refused writes: nobody can resume
    it (its id comes only with the body), so its cancel goes as soon as Redis takes it (was: left to
    Redis 7 s on, 7 s more decoding for a client gone, plus a reaper's period)."""
    monkeypatch.setattr(leaving, "RETRY_S", (0.5, 0.5))

    async def run() -> tuple[bool, float | None]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=60)
        bus, client = Bus(settings, make_celery(settings)), aioredis.Redis.from_url(redis_url)
        cancel, left = key("cancel", "r7"), key("left")
        bus.leaving.reading("r7")
        await bus.watching.watch("r7", "body")
        await client.config_set("maxmemory", 1)
        try:
            bus.leaving.leave("r7", "body", time.time(), finished=False, resumable=False)
            await asyncio.wait_for(_logged(caplog, "request r7: its cancel failed"), 10)
        finally:
            await client.config_set("maxmemory", 0)
        await asyncio.wait_for(_logged(caplog, "request r7: its cancel went through"), 10)
        cancelled, due = bool(await client.exists(cancel)), await client.zscore(left, "r7")
        await client.aclose()
        await asyncio.wait_for(bus.close(), 5)
        return cancelled, due

    with caplog.at_level("WARNING", "dayzero.gateway"):
        assert asyncio.run(run()) == (True, None)
