"""The gateway's asynchronous side of a request's life (dayzero.serving.lifecycle, whose keys these
are): admission, who reads a stream, and the cancel when nobody does."""

from __future__ import annotations

import redis.asyncio as aioredis

from .lifecycle import Queue, admission, key
from .messages import GenerationRequest
from .queue_scripts import ADMIT


class Watching:
    """The gateway's asynchronous side: who reads a stream, and the cancel when nobody does."""

    def __init__(self, client: aioredis.Redis, stream_ttl_s: int) -> None:
        self.r, self.ttl_s = client, stream_ttl_s
        self._admit = client.register_script(ADMIT)

    async def admit(
        self, requests: list[GenerationRequest], images: list[bytes], reader: str, queued_s: float, queue: Queue
    ) -> bool:
        """``Lifecycle.admit`` for all of ``requests`` and their messages pushed onto the queue, in
        one round trip; or nothing, False, when the queue cannot take them all."""
        keys, args = admission(requests, images, reader, queued_s, self.ttl_s, queue)
        return bool(await self._admit(keys=keys, args=args))

    async def known(self, rid: str) -> bool:
        return bool(await self.r.exists(key("req", rid)))

    async def reader(self, rid: str) -> bytes | None:
        """The digest of the API key or resume token that may read the stream."""
        return await self.r.get(key("access", rid))

    async def watch(self, rid: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.incr(key("watchers", rid))
        pipe.expire(key("watchers", rid), self.ttl_s)
        await pipe.execute()

    async def unwatch(self, rid: str) -> int:
        """A client went away; returns how many still read the stream."""
        return int(await self.r.decr(key("watchers", rid)))

    async def cancel_unwatched(self, rid: str) -> None:
        """Ask the request's worker to stop, unless a client reads it again or it has ended."""
        watchers = await self.r.get(key("watchers", rid))
        if int(watchers or 0) <= 0 and not await self.r.exists(key("done", rid)):
            await self.r.set(key("cancel", rid), 1, ex=self.ttl_s)
