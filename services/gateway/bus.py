"""The gateway's side of the queue: submit requests, read token streams, cancel, check readiness."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis
from celery import Celery
from starlette.concurrency import run_in_threadpool

from dayzero.serving.messages import GenerationRequest, PrefillJob
from dayzero.serving.queue import TASKS
from dayzero.serving.store import P, Store, stream_key
from dayzero.settings import Settings
from dayzero.telemetry import carrier


@dataclass(frozen=True, slots=True)
class TokenEvent:
    entry_id: str
    index: int
    token: int
    text: str
    finish_reason: str | None
    usage: dict | None
    error: str
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    prompt: list | None = None  # [(logprob, [(token, logprob), ...]), ...] for prompt tokens 1..


class Bus:
    def __init__(self, settings: Settings, celery: Celery) -> None:
        self.settings, self.celery = settings, celery
        self.r = aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=None)
        self.store = Store.connect(settings.redis_url, settings.stream_ttl_s)  # sync, for the thread pool
        self._cancels: dict[str, asyncio.Task] = {}

    async def queue_depth(self, stage: str) -> int:
        return int(await self.r.llen(stage))

    async def submit(self, request: GenerationRequest, images: list[bytes]) -> None:
        """Record the request (and its images' bytes) and queue it: vision first when it has images."""

        def enqueue() -> None:
            self.store.register(request, images)
            self.store.mark_queued(request.request_id, self.settings.visibility_timeout_s)
            job = PrefillJob(request=request, trace=carrier())
            self.celery.send_task(TASKS["vision" if images else "prefill"], args=[job.model_dump_json()])

        await run_in_threadpool(enqueue)

    @staticmethod
    def valid_entry_id(entry: str) -> bool:
        ms, _, seq = entry.partition("-")
        return ms.isdigit() and seq.isdigit() and len(entry) < 40

    async def known(self, request_id: str) -> bool:
        return bool(await self.r.exists(f"{P}req:{request_id}"))

    async def events(self, request_id: str, after: str = "0-0") -> AsyncIterator[TokenEvent | None]:
        """Stream entries after ``after``; ``None`` each keep-alive interval without one."""
        last = after
        block_ms = int(self.settings.keepalive_s * 1000)
        while True:
            reply = await self.r.xread({stream_key(request_id): last}, block=block_ms, count=64)
            if not reply:
                yield None
                continue
            for entry_id, fields in reply[0][1]:
                last = entry_id.decode()
                event = TokenEvent(
                    last,
                    int(fields[b"i"]),
                    int(fields[b"t"]),
                    fields[b"x"].decode(),
                    fields[b"f"].decode() if b"f" in fields else None,
                    json.loads(fields[b"u"]) if b"u" in fields else None,
                    fields.get(b"e", b"").decode(),
                    float(fields[b"l"]) if b"l" in fields else None,
                    tuple(map(tuple, json.loads(fields[b"k"]))) if b"k" in fields else (),
                    json.loads(fields[b"p"]) if b"p" in fields else None,
                )
                yield event
                if event.finish_reason:
                    return

    # -- watchers and cancellation ---------------------------------------------------------------------
    async def watch(self, request_id: str) -> None:
        await self.r.incr(f"{P}watchers:{request_id}")
        await self.r.expire(f"{P}watchers:{request_id}", self.settings.stream_ttl_s)

    async def unwatch(self, request_id: str, finished: bool) -> None:
        """A client went away: cancel after the grace period unless another client is watching."""
        left = await self.r.decr(f"{P}watchers:{request_id}")
        if finished or left > 0:
            return
        task = asyncio.create_task(self._cancel_later(request_id))
        self._cancels[request_id] = task
        task.add_done_callback(lambda _: self._cancels.pop(request_id, None))

    async def _cancel_later(self, request_id: str) -> None:
        await asyncio.sleep(self.settings.disconnect_grace_s)
        watchers = await self.r.get(f"{P}watchers:{request_id}")
        if int(watchers or 0) <= 0 and not await self.r.exists(f"{P}done:{request_id}"):
            await self.r.set(f"{P}cancel:{request_id}", 1, ex=self.settings.stream_ttl_s)

    # -- readiness -------------------------------------------------------------------------------------
    async def ready(self, extra_stages: tuple[str, ...] = ()) -> dict[str, int]:
        await self.r.ping()
        return {
            stage: len(await run_in_threadpool(self.store.live_workers, stage, 3 * self.settings.lease_s + 2))
            for stage in (*extra_stages, "prefill", "decode")
        }

    async def close(self) -> None:
        for task in list(self._cancels.values()):
            await task
        await self.r.aclose()
