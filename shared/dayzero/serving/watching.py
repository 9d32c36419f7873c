"""The gateway's asynchronous side of a request's life (dayzero.serving.lifecycle, whose keys these
are): admission, who reads a stream, and the cancel when nobody does; a stopping gateway leaves the
cancels of its clients' reads still within their grace to Redis, whichever gateway runs cancels them
when it ends (``cancel_left``, in its reaper's passes), unless a client reads the request again by
then: a rolling restart's clients resume on another gateway, or on this one restarted."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from . import redis_clock as clock
from .admission import Queue, Record, admission, record_s
from .client_scripts import registered
from .keys import key
from .queue_scripts import ADMIT

# A stream's readers: a set of one id per read (adding or removing one twice, as a retry after a
# lost reply does, counts once); it lives as long as the request can (ARGV[2]) and goes with its
# last reader. ARGV[1]: 1 a reader comes, 0 it leaves. A reader that comes takes back the cancel a
# stopped gateway left (KEYS[2], ARGV[4]: the request): its own leave decides (left, it cancelled the
# request within that read's grace, as soon as the stopped gateway's was over).
READERS = """
redis.call(ARGV[1] == '1' and 'SADD' or 'SREM', KEYS[1], ARGV[3])
if ARGV[1] == '1' then redis.call('ZREM', KEYS[2], ARGV[4]) end
local n = redis.call('SCARD', KEYS[1])
if n > 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return n
"""

# KEYS: the request's readers, done, cancel; ARGV: the cancel mark's s. The worker is asked to stop
# unless a client reads the stream or the request has ended, decided in one step: as three commands
# (two reads, then the write), a resume's watch that reached Redis between them (on another gateway,
# or after a stall) was cancelled under its reader.
CANCEL_UNWATCHED = """
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[3], 1, 'EX', ARGV[1])
end
"""

# KEYS: the request's readers, done, the cancels stopped gateways left; ARGV: the cancel's unix time on
# Redis's clock (another gateway's reaper cancels it: by a host's clock 30 s ahead, a rolling restart's
# client that would resume found its request cancelled), the request. Left only while nobody reads it
# (and it has not ended), in one step: a resume on another gateway whose watch came after the stopping
# one's unwatch, before its ZADD, left an entry under its reader, which cancelled the request when that
# read left, within its own grace.
CANCEL_LATER = """
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('ZADD', KEYS[3], ARGV[1], ARGV[2])
end
"""


# KEYS: the cancels stopped gateways left, the request's readers, done, cancel; ARGV: the request, now
# (unix time), the cancel mark's s. A left cancel that is due goes, and cancels the request unless a
# client reads it or it ended, in one step: read, then removed apart, an entry another stopping
# gateway left again between the two (due later) was removed unseen, its cancel lost.
CANCEL_DUE = """
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('SET', KEYS[4], 1, 'EX', ARGV[3])
end
return 1
"""


def cancel_left(client: redis.Redis, stream_ttl_s: int) -> list[str]:
    """Cancel the requests whose grace a stopped gateway left here (``Watching.cancel_later``) and
    has ended, unless a client reads them again (or they ended); returns their ids. Their entries go.
    Due by Redis's time as this process knows it (``redis_clock.now``: the reaper's pass measured it)."""
    now, cancel = clock.now(), registered(client, CANCEL_DUE)
    due = [rid.decode() for rid in client.zrangebyscore(key("left"), "-inf", now)]
    families = ("watchers", "done", "cancel")
    return [
        rid
        for rid in due
        if cancel(keys=[key("left"), *(key(f, rid) for f in families)], args=[rid, now, stream_ttl_s])
    ]


class Watching:
    """The gateway's asynchronous side: who reads a stream, and the cancel when nobody does."""

    def __init__(self, client: aioredis.Redis, stream_ttl_s: int, queued_s: float) -> None:
        """``queued_s``: the broker's visibility timeout (a wait in the queue, or a generation, is
        shorter); the set of a request's readers lives as long as its record can (``record_s``)."""
        self.r, self.ttl_s, self.queued_s = client, stream_ttl_s, queued_s
        self.readers_s = record_s(queued_s, stream_ttl_s)
        self._admit, self._readers = client.register_script(ADMIT), client.register_script(READERS)
        self._cancel, self._later = client.register_script(CANCEL_UNWATCHED), client.register_script(CANCEL_LATER)

    async def admit(self, records: list[Record], images: list[bytes], reader: str, queue: Queue) -> bool:
        """``Lifecycle.admit`` for all of ``records``, their messages pushed onto the queue and their
        first reads watched (``watch``), in one round trip; or nothing, False, when the queue cannot
        take them all."""
        keys, args = admission(records, images, reader, self.queued_s, self.ttl_s, queue)
        return bool(await self._admit(keys=keys, args=args))

    async def ping(self) -> None:
        await self.r.ping()

    async def known(self, rid: str) -> bool:
        return bool(await self.r.exists(key("req", rid)))

    async def reader(self, rid: str) -> bytes | None:
        """The digest of the API key or resume token that may read the stream."""
        return await self.r.get(key("access", rid))

    async def watch(self, rid: str, watcher: str) -> None:
        """A client reads the stream (``watcher``: an id of this read). The set outlives the longest
        request (with one stream TTL it lapsed under a client reading for longer, and the request
        was cancelled under another reader when the first left)."""
        await self._change(rid, watcher, coming=True)

    async def unwatch(self, rid: str, watcher: str) -> int:
        """A client went away; returns how many still read the stream."""
        return await self._change(rid, watcher, coming=False)

    async def _change(self, rid: str, watcher: str, coming: bool) -> int:
        keys, args = [key("watchers", rid), key("left")], [int(coming), self.readers_s, watcher, rid]
        return int(await self._readers(keys=keys, args=args))

    async def cancel_later(self, rid: str, at: float) -> None:
        """The gateway stops: the request is cancelled at ``at`` (its grace's end; Redis's unix time,
        ``redis_clock.now``: another gateway's reaper cancels it) unless a client reads it again by
        then (``cancel_left``; cancelled at once, a rolling restart's resume found its request
        cancelled on the next gateway); nothing while a client reads it."""
        await self._later(keys=[key("watchers", rid), key("done", rid), key("left")], args=[repr(at), rid])

    async def cancel_unwatched(self, rid: str) -> None:
        """Ask the request's worker to stop, unless a client reads it again or it has ended."""
        await self._cancel(keys=[key(family, rid) for family in ("watchers", "done", "cancel")], args=[self.ttl_s])
