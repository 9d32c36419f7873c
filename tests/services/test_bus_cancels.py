"""The gateway's pending cancels: each disconnect's, all decided at once when the gateway stops."""

from __future__ import annotations

import asyncio

from dayzero.serving.queue import make_celery
from dayzero.settings import Settings
from services.gateway.bus import Bus


def test_a_request_abandoned_twice_within_the_grace_is_decided_at_close(redis_url, monkeypatch):
    """A resumed stream abandoned again: its second pending cancel replaced the first in the gateway's
    book, so stopping decided only one and the other slept out its grace."""
    decided: list[str] = []

    async def unwatch(request_id: str, watcher: str) -> int:
        return 0  # nobody watches any more

    async def cancel_unwatched(request_id: str) -> None:
        decided.append(request_id)

    async def run() -> list[str]:
        settings = Settings(redis_url=redis_url, disconnect_grace_s=60)
        bus = Bus(settings, make_celery(settings))
        monkeypatch.setattr(bus.watching, "unwatch", unwatch)
        monkeypatch.setattr(bus.watching, "cancel_unwatched", cancel_unwatched)
        await bus.unwatch("r1", "first", finished=False)
        await bus.unwatch("r1", "resumed", finished=False)
        await asyncio.wait_for(bus.close(), 5)
        return list(decided)  # (asyncio.run cancels what is left after this)

    assert asyncio.run(run()) == ["r1", "r1"]
