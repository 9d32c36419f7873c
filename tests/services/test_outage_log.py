"""A Redis outage's 503s in the gateway's log: the first said with its reason, the rest counted into
one later line (an outage's last ones too), not one line each."""

from __future__ import annotations

import asyncio

import redis
from fastapi.testclient import TestClient

from dayzero.settings import Settings
from services.gateway.app import make_app
from services.gateway.errors import refusals

from .conftest import chat
from .test_decode_appends import writes_refused


def test_requests_redis_cannot_queue_are_logged_once_not_one_line_each(demo_dir, redis_url, caplog):
    """A Redis outage's 503s: the first logged with its reason, the next ones counted into a later line
    (was: one line each, as many as the access log's: 508 per gateway in the soak's outages)."""
    settings, client = Settings(checkpoint=demo_dir, redis_url=redis_url), redis.Redis.from_url(redis_url)
    refusing = writes_refused(client)
    with TestClient(make_app(settings)) as gateway, refusing, caplog.at_level("WARNING", "dayzero.gateway"):
        answers = [gateway.post("/v1/chat/completions", json=chat("hello", max_tokens=2)) for _ in range(20)]
    assert [a.status_code for a in answers] == [503] * 20
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("redis unavailable")]
    assert len(lines) == 1 and lines[0].endswith("answering 503 queue_unavailable"), lines


def test_the_last_503s_of_an_outage_are_counted_in_the_log(caplog):
    """The 503s after a refusal's line were counted only into the next refusal's line: an outage's
    last ones (up to 10 s of them) went unsaid. Now a line counts them once the 10 s are over."""

    async def outage() -> None:
        refused = refusals(every_s=0.2)
        for _ in range(5):
            refused.failed(redis.ConnectionError("Connection refused"))
        while not any(r.getMessage().startswith("4 more") for r in caplog.records):
            await asyncio.sleep(0.02)

    with caplog.at_level("WARNING", "dayzero.gateway"):
        asyncio.run(asyncio.wait_for(outage(), 10))
    assert [r.getMessage() for r in caplog.records] == [
        "redis unavailable: Connection refused; answering 503 queue_unavailable",
        "4 more requests answered 503 queue_unavailable (Redis unavailable) since the last line",
    ]
