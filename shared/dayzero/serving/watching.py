"""The gateway's asynchronous side of a request's life (dayzero.serving.lifecycle, whose keys these
are): admission, who reads a stream, and the cancel when nobody does."""

from __future__ import annotations

import redis.asyncio as aioredis

from .lifecycle import Queue, admission, key, record_s
from .messages import GenerationRequest
from .queue_scripts import ADMIT

# A stream's count of readers changes by ARGV[1]; while someone reads, it lives as long as the
# request can (ARGV[2]); with nobody, as long as the stream is resumable (ARGV[3]).
READERS = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], n > 0 and ARGV[2] or ARGV[3])
return n
"""


class Watching:
    """The gateway's asynchronous side: who reads a stream, and the cancel when nobody does."""

    def __init__(self, client: aioredis.Redis, stream_ttl_s: int, queued_s: float) -> None:
        """``queued_s``: the broker's visibility timeout (a wait in the queue, or a generation, is
        shorter); a request's count of readers lives as long as its record can (``record_s``)."""
        self.r, self.ttl_s, self.queued_s = client, stream_ttl_s, queued_s
        self.readers_s = record_s(queued_s, stream_ttl_s)
        self._admit, self._readers = client.register_script(ADMIT), client.register_script(READERS)

    async def admit(self, requests: list[GenerationRequest], images: list[bytes], reader: str, queue: Queue) -> bool:
        """``Lifecycle.admit`` for all of ``requests`` and their messages pushed onto the queue, in
        one round trip; or nothing, False, when the queue cannot take them all."""
        keys, args = admission(requests, images, reader, self.queued_s, self.ttl_s, queue)
        return bool(await self._admit(keys=keys, args=args))

    async def known(self, rid: str) -> bool:
        return bool(await self.r.exists(key("req", rid)))

    async def reader(self, rid: str) -> bytes | None:
        """The digest of the API key or resume token that may read the stream."""
        return await self.r.get(key("access", rid))

    async def watch(self, rid: str) -> None:
        """A client reads the stream. Its count outlives the longest request (with one stream TTL
        it lapsed under a client reading for longer: the next reader to leave took it below zero,
        cancelling the request under another reader, and left the key behind for good)."""
        await self._count(rid, 1)

    async def unwatch(self, rid: str) -> int:
        """A client went away; returns how many still read the stream."""
        return await self._count(rid, -1)

    async def _count(self, rid: str, change: int) -> int:
        return int(await self._readers(keys=[key("watchers", rid)], args=[change, self.readers_s, self.ttl_s]))

    async def cancel_unwatched(self, rid: str) -> None:
        """Ask the request's worker to stop, unless a client reads it again or it has ended."""
        watchers = await self.r.get(key("watchers", rid))
        if int(watchers or 0) <= 0 and not await self.r.exists(key("done", rid)):
            await self.r.set(key("cancel", rid), 1, ex=self.ttl_s)
