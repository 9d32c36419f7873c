"""Every open token stream of this gateway read over one Redis connection.

One reader task issues a single ``XREAD BLOCK`` over all watched streams and hands each entry to its
subscriber's queue, so open streams cost no connection each (redis-py's pool would run out long
before the admission bound). A new subscriber wakes the blocked read (a reader it starts reads its
stream at once) by appending to this gateway's own wake stream, which every read includes from the
last wake-up it saw (not ``$``: a wake-up that reaches Redis just before the read would be missed,
and the new stream left unread until another stream's entry or the block's end). A lost Redis ends
every open subscription with the error (the stream's reader turns it into an error event), and so
does a Redis that stops answering (frozen, its host unreachable) for ``read_margin_s`` past the
block. A read Redis ends while it answers (``UNBLOCKED``, its connection closed: it became a
replica, a failover's old master) is read again: the streams go on (their wake-ups refused
meanwhile, polled). A Redis that restarted in between (another run_id) is read again too, but each
stream whose request it no longer holds (started empty) ends as a lost Redis's do: nothing would
ever write it again. A wake-up Redis refuses (writes refused: its memory limit) leaves the new
subscriber's stream polled (``POLL_S``) till the next blocked read takes it in. A subscriber
``BACKLOG`` entries behind (its client reads slower than tokens come) is read no further until it
has taken half of them: the rest wait in Redis, not in this gateway's memory. A request that ended
(its ``done`` mark) with a stream its end could not be written to (``Settled``'s UNCLOSED) is ended
for its readers with the end SETTLE kept beside the mark (``unclosed``: its code, its usage), once
their stream has been quiet for a block: the reader looks at most once a block, one MGET of the
quiet streams' marks (unclosed.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from dayzero.redis_clients import async_client
from dayzero.serving.broker import AsyncUnblockedIsLostParser
from dayzero.serving.keys import key
from dayzero.serving.records import Token, decode

from .held_loop import CONNECT_S, HeldLoopConnect
from .restarts import RedisRestarted, not_held, run_id
from .subscription import BACKLOG, Closed, Subscription, entry_order
from .unclosed import unclosed_ends

log = logging.getLogger("dayzero.gateway")
READ_MARGIN_S = 10.0  # a blocked read unanswered this long after its block ends: Redis is lost (the commands' bound)
POLL_S = 0.1  # a subscription whose wake-up Redis refused is read this often till the hub's read takes it in


class StreamHub:
    """``reader``'s one connection blocks in XREAD; ``commands`` (a shared pool) sends the wake-ups."""

    def __init__(
        self, url: str, commands: aioredis.Redis, block_ms: int = 5000, read_margin_s: float = READ_MARGIN_S
    ) -> None:
        timeout = block_ms / 1000 + read_margin_s  # (none: a frozen Redis held every open stream for ever)
        self.r = async_client(
            url,
            socket_connect_timeout=CONNECT_S,
            socket_timeout=timeout,
            max_connections=1,
            connection_mixin=HeldLoopConnect,  # (a connect its own loop timed out ended every open stream)
            retry=Retry(NoBackoff(), 0, ()),  # none: a closed connection is news of Redis (a restart ends streams)
            parser_class=AsyncUnblockedIsLostParser,  # an UNBLOCKED read: its connection lost (Redis closes it)
        )
        self.commands, self.block_ms = commands, block_ms
        self.wake_key = key("wake", uuid.uuid4().hex)
        self.woken = "0-0"  # the last wake-up a read returned
        self.subs: set[Subscription] = set()
        self._reader: asyncio.Task | None = None
        self._wakes: set[asyncio.Task] = set()  # wake-ups on their way (a held subscription resumes)
        self._look_at = 0.0  # when the reader next looks for ended requests whose streams have no end
        self.run_id: str | None = None  # the Redis server's run last seen (INFO's run_id)

    @property
    def open(self) -> int:
        return len(self.subs)

    @contextlib.asynccontextmanager
    async def subscribe(self, request_id: str, after: str = "0-0") -> AsyncIterator[Subscription]:
        sub, polled = Subscription(request_id, after, resume=self._resume), None
        self.subs.add(sub)
        try:
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read_forever())  # its first read takes sub in: no wake-up
            else:
                try:
                    await self._wake()  # the blocked read takes sub in at once
                except redis.ResponseError as exc:  # writes refused (Redis at its memory limit), reads answer
                    log.warning("token streams: a wake-up refused, the stream polled till the next read: %s", exc)
                    polled = asyncio.create_task(self._poll(sub))
            yield sub
        finally:
            self.subs.discard(sub)
            if polled is not None:
                polled.cancel()

    async def _poll(self, sub: Subscription) -> None:
        """Read ``sub``'s stream every POLL_S till a blocked read of the hub's takes it in: its
        wake-up refused, the read blocked meanwhile began without it, and ends up to a block later
        (a resume during the refusal waited for it, and so did the entries that came after)."""
        stream = key("tokens", sub.request_id)
        with contextlib.suppress(redis.RedisError):  # (the hub's own read meets it, and ends sub)
            while not sub.taken_in and sub in self.subs:
                if sub.queue.qsize() < BACKLOG:
                    reply = await self.commands.xread({stream: sub.last}, count=64)
                    if sub in self.subs:  # (not ended meanwhile: nothing after its end)
                        self._deliver(sub, reply[0][1] if reply else ())
                await asyncio.sleep(POLL_S)

    async def _wake(self) -> None:
        pipe = self.commands.pipeline(transaction=False)
        pipe.xadd(self.wake_key, {"w": 1}, maxlen=16, approximate=True)
        pipe.expire(self.wake_key, 3600)
        await pipe.execute()

    def _resume(self) -> None:
        task = asyncio.create_task(self._wake())
        self._wakes.add(task)
        task.add_done_callback(self._woken)

    def _woken(self, task: asyncio.Task) -> None:
        self._wakes.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a lost Redis ends the reads anyway
            log.warning("token streams: a wake-up failed: %s", task.exception())

    async def finish_by(self, request_id: str, after: str) -> Token | None:
        """The stream's finish when it ends at or before ``after`` (a resume from its end: nothing to wait for)."""
        last = await self.commands.xrevrange(key("tokens", request_id), count=1)
        if not last or entry_order(last[0][0].decode()) > entry_order(after):
            return None
        token = decode(request_id, last[0][1])
        return token if token.finish_reason else None

    async def _read_forever(self) -> None:
        """Reads until no subscription is left; a lost Redis ends every one (Redis lost while the
        reads Redis refused were sorted out too: it ended the task, its exception never retrieved,
        and left the open streams waiting for ever)."""
        # the server's run, asked once, not before each reader's first read (a reader starts per request
        # on an idle stack); a restart while no reader ran is found at the next closed read as any other
        if self.run_id is None:
            with contextlib.suppress(redis.RedisError):  # (lost: the read meets it)
                self.run_id = await run_id(self.r)
        while self.subs:
            try:
                try:
                    await self._read_once()
                    if asyncio.get_running_loop().time() >= self._look_at:  # once a block, not per read
                        await self._end_unclosed()
                except redis.ResponseError as exc:  # Redis refused the read, not lost: end only who caused it
                    await self._drop_unreadable(exc)
            except redis.RedisError as exc:
                if self.subs and await self._still_answers(exc):
                    continue
                if self.subs:  # (none: the hub is closing)
                    log.warning("token streams lost redis: %s", exc)
                self._end_all(exc)
                with contextlib.suppress(redis.RedisError):  # (closing a connection to a frozen Redis can time out)
                    await self.r.connection_pool.disconnect()
            except Exception as exc:  # nobody awaits this task: ended, it left every open stream waiting
                log.exception("token streams: the read failed; ending the open streams")
                self._end_all(exc)

    async def _still_answers(self, exc: redis.RedisError) -> bool:
        """Whether Redis, having closed the read's connection (or ended the read: UNBLOCKED), answers
        a PING on a new one: then the read is tried again (it was taken for a lost Redis and ended
        every open stream, 11 at once in the soak, while Redis answered reads). Not after a read
        unanswered past its block (frozen: the streams end), nor when the PING fails (Redis lost).
        The PING is INFO's: a Redis that restarted meanwhile (another run) ends the streams it lost."""
        if not isinstance(exc, redis.ConnectionError):  # (a TimeoutError is none)
            return False
        with contextlib.suppress(redis.RedisError):
            await self.r.connection_pool.disconnect()
        try:
            before, self.run_id = self.run_id, await run_id(self.r)  # (as a PING)
            if None not in (before, self.run_id) and before != self.run_id:
                await self._end_lost(exc)
        except redis.RedisError:
            return False
        log.warning("token streams: redis ended the read and answers (%s); reading again", exc)
        await asyncio.sleep(POLL_S)  # (a Redis that ends every read: a read a POLL_S, not a busy loop)
        return True

    async def _end_lost(self, exc: redis.RedisError) -> None:
        """Redis restarted: end the subscriptions whose requests it no longer holds (restarts.py)."""
        lost = await not_held(self.r, list(self.subs))
        log.warning(
            "token streams: redis restarted (%s); %d of %d open streams it lost end", exc, len(lost), len(self.subs)
        )
        for sub in lost:
            sub.close(RedisRestarted(f"redis restarted without request {sub.request_id}"))
            self.subs.discard(sub)

    def _end_all(self, exc: BaseException) -> None:
        for sub in list(self.subs):
            sub.close(exc)
        self.subs.clear()

    async def _drop_unreadable(self, exc: redis.ResponseError) -> None:
        """End each subscription whose own read Redis refuses; all of them when none alone is refused."""
        refused = []
        for sub in list(self.subs):
            try:
                await self.r.xread({key("tokens", sub.request_id): sub.last}, count=1)
            except redis.ResponseError:
                refused.append(sub)
        log.warning("token streams: redis refused %d of %d reads: %s", len(refused), len(self.subs), exc)
        for sub in refused or list(self.subs):
            sub.close(exc)
            self.subs.discard(sub)

    async def _end_unclosed(self) -> None:
        """Each subscription whose stream was quiet since the last look (a block ago) and whose
        request ended without its stream's end gets the end its ``done`` mark names."""
        self._look_at = asyncio.get_running_loop().time() + self.block_ms / 1000
        quiet = [sub for sub in self.subs if sub.last == sub.looked and not sub.held]
        for sub in self.subs:
            sub.looked = sub.last
        for sub, end in await unclosed_ends(self.r, quiet) if quiet else ():
            log.error(
                "request %s ended %s without its stream's end: its reader is ended", sub.request_id, end.finish_reason
            )
            sub.queue.put_nowait(end)
            self.subs.discard(sub)

    async def _read_once(self) -> None:
        wanted: dict[str, str] = {}
        readers: dict[str, list[Subscription]] = {}
        for sub in self.subs:  # one cursor per stream: the earliest any of its subscribers needs
            sub.held = sub.queue.qsize() >= BACKLOG
            if sub.held:
                continue
            stream = key("tokens", sub.request_id)
            if stream not in wanted or entry_order(sub.last) < entry_order(wanted[stream]):
                wanted[stream] = sub.last
            readers.setdefault(stream, []).append(sub)
            sub.taken_in = True
        reply = await self.r.xread({self.wake_key: self.woken, **wanted}, block=self.block_ms, count=64)
        for raw_key, entries in reply or ():
            if raw_key.decode() == self.wake_key:
                self.woken = entries[-1][0].decode()
            for sub in readers.get(raw_key.decode(), ()):
                self._deliver(sub, entries)
        if reply:  # the subscribers woken write their events first: the next read's send is not theirs to wait for
            await asyncio.sleep(0)

    def _deliver(self, sub: Subscription, entries) -> None:
        """Queue for ``sub`` the entries after its last (another read, a poll, may have queued some)."""
        for entry_id, fields in entries:
            entry = entry_id.decode()
            if entry_order(entry) > entry_order(sub.last):
                sub.last = entry
                try:
                    token = decode(sub.request_id, fields)
                except (KeyError, ValueError) as exc:  # not a token entry (another writer's): its stream ends
                    log.error("request %s: its stream holds an entry it cannot read: %r", sub.request_id, exc)
                    sub.close(exc)
                    self.subs.discard(sub)
                    return
                sub.queue.put_nowait(token)

    async def close(self) -> None:
        for sub in list(self.subs):
            sub.close(Closed())
        self.subs.clear()
        if self._reader is not None:
            self._reader.cancel()  # redis-py lets a cancelled read finish: up to a whole block (keepalive_s) ...
            await self.r.connection_pool.disconnect()  # ... unless its connection closes
            with contextlib.suppress(asyncio.CancelledError, redis.RedisError):
                await self._reader
        with contextlib.suppress(redis.RedisError):
            await self.commands.delete(self.wake_key)
        await self.r.aclose()
